//! ksearch-task (placeholder; see docs/ARCHITECTURE.md)
