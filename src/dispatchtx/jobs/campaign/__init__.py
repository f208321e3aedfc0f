"""The main job: a real MPI fault campaign with several coordinators on one
store (`runner`)."""
