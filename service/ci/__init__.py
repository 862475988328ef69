"""Where CI users look: the verdict of a `fusionwatch submit` (or `run --server`) reported from the CI
step itself to the forge's API with the token the CI system hands the job — GitHub check runs, commit
statuses and pull-request comments (github.py), GitLab commit statuses and merge-request notes
(gitlab.py) — and the expected fused-op counts a repository checks in (expectations.py)."""
