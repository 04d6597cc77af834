"""The index of PROTOCOL §3.7: log segments written by collectors, the catalog kept by the reconciler."""
