//! Production Clock and Runtime: the system clock and tokio (issue 3).
