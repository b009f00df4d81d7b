//! Test kit: invariant checker, model server, fuzz entry points (being written).
