//! ksearch-knowledge (placeholder; see docs/ARCHITECTURE.md)
