"""Operating a release: the hash-chained audit log, the population ε ledger, run journals, verify."""
