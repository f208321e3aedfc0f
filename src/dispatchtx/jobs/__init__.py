"""The programs that exercise the library: `dispatchtx campaign | simulate |
bench | example`, the MPI job and the bench baselines, and the workloads they
run. Nothing in the library imports from here."""
