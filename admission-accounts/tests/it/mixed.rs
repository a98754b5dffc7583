//! A monitor scenario mixing all four families (written once the families exist).
