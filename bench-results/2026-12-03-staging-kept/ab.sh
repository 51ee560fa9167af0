# Host a step at b64 before ($BASE: a worktree at 775e504) and after this folder's change, 3
# rounds alternated: ../2026-12-02-host-beside/host.sh's rows, from the repo root:
#   git worktree add /tmp/base 775e504; BASE=/tmp/base bash bench-results/2026-12-03-staging-kept/ab.sh
exec bash "$(dirname "$0")/../2026-12-02-host-beside/host.sh"
