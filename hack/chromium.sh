#!/usr/bin/env bash
# chromium.sh: find (or install once) a headless Chromium for the console's
# browser tests, which drive it with chromedp. hack/test.sh calls it.
#
# Prints the path of the executable on stdout and exits 0:
#   export POLICYD_CHROMIUM="$(hack/chromium.sh)"
#
# In order, it prints:
#   - $POLICYD_CHROMIUM, when that is already set to an executable (a
#     browser of the developer's choosing);
#   - the first of chromium, chromium-browser, google-chrome and
#     google-chrome-stable found on PATH;
#   - else, when it runs as root or has passwordless sudo and apt-get exists,
#     Debian's chromium package, installed with
#     `apt-get install -y --no-install-recommends chromium` (apt-get update
#     first only when the package lists do not know chromium), then its path.
# Concurrent callers are serialised with flock under ~/.cache, and apt-get
# waits up to 10 minutes for another apt or dpkg run to release its lock.
# Progress and apt-get's output go to stderr only.
#
# When no browser can be had it prints nothing on stdout, one line saying why
# on stderr, and exits 3; the browser tests then skip, saying so.
set -euo pipefail

log() { printf 'chromium.sh: %s\n' "$*" >&2; }
unavailable() { log "no chromium for the browser tests: $*"; exit 3; }

# found prints the first browser on PATH, or fails. command -v alone would
# also name a file on PATH that is not executable.
found() {
	local name path
	for name in chromium chromium-browser google-chrome google-chrome-stable; do
		if path="$(command -v "$name" 2>/dev/null)" && [[ -x "$path" ]]; then
			printf '%s\n' "$path"
			return 0
		fi
	done
	return 1
}

if [[ -n "${POLICYD_CHROMIUM:-}" ]]; then
	if [[ -x "$POLICYD_CHROMIUM" && ! -d "$POLICYD_CHROMIUM" ]]; then
		printf '%s\n' "$POLICYD_CHROMIUM"
		exit 0
	fi
	log "POLICYD_CHROMIUM=$POLICYD_CHROMIUM is not an executable; looking on PATH"
fi
found && exit 0

command -v apt-get >/dev/null 2>&1 || unavailable "none on PATH, and no apt-get to install Debian's chromium package"
if [[ "$(id -u)" -eq 0 ]]; then
	as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	as_root=(sudo -n)
else
	unavailable "none on PATH, and installing Debian's chromium package needs root or passwordless sudo (apt-get install chromium)"
fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/policyd"
mkdir -p "$cache" 2>/dev/null || unavailable "cannot create $cache for the install lock"
exec 9>"$cache/chromium.lock"
if ! flock -n 9; then
	log "waiting for another chromium.sh to finish installing"
	flock 9
fi
# The one holding the lock before us may have installed it.
found && exit 0

apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600)
install() { "${apt[@]}" install -y --no-install-recommends chromium >&2; }

# known reports whether the package lists offer chromium: without them (a
# fresh image) the install fails, and only then is apt-get update worth its
# time.
known() { [[ "$(apt-cache policy chromium 2>/dev/null | awk '/Candidate:/ {print $2}')" =~ ^[0-9] ]]; }

log "installing Debian's chromium package (apt-get install chromium; a few minutes the first time)"
if ! install; then
	known && unavailable "apt-get install chromium failed (see above)"
	log "the package lists do not offer chromium; running apt-get update and retrying"
	"${apt[@]}" update >&2 || unavailable "apt-get update failed (see above)"
	known || unavailable "Debian's package lists offer no chromium package for this system"
	install || unavailable "apt-get install chromium failed (see above)"
fi
found || unavailable "apt-get installed chromium, but no chromium is on PATH"
