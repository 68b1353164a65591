//! ksearch-search (placeholder; see docs/ARCHITECTURE.md)
