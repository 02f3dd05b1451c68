//! Load evaluation: k6-style constant-arrival-rate scenarios (issue 6).
pub mod cli;
