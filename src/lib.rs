//! fusegraph
