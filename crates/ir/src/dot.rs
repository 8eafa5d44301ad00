//! DOT export.
