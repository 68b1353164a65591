//! ksearch-store (placeholder; see docs/ARCHITECTURE.md)
