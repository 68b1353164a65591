//! ksearch-llm (placeholder; see docs/ARCHITECTURE.md)
