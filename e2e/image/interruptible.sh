# Sourced by build-base.sh and build.sh: `in_background CMD...` runs their long step in its own
# session in the background, so that INT or TERM reaches the caller's trap at once and stops all of
# it (debootstrap and dpkg in the chroot; make, buildah and the RUN step) before the caller's EXIT
# trap unmounts and removes what it made.
child=
stop() {
  if [ -n "$child" ]; then kill -TERM -- -"$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  exit 130
}
trap stop INT TERM
in_background() { setsid "$@" & child=$!; local rc=0; wait "$child" || rc=$?; child=; return "$rc"; }
