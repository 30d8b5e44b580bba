//! Tests of the candidate pipeline.
