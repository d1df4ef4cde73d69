//! Auto-resume policy with backoff (being written).
