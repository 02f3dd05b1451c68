//! SKELETON: filled in by its issue.
