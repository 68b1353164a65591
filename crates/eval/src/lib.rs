//! ksearch-eval (placeholder; see docs/ARCHITECTURE.md)
