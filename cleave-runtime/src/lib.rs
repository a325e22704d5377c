//! Runtime for Cleave-generated launchers.
