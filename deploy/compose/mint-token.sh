#!/usr/bin/env bash
# mint-token.sh prints an HS256 sidecar JWT for the compose demo, signed with
# the demo key demo-secrets/jwt-hmac-secret (auth.jwt.hmac_secret_file of the
# nodes). It stands in for the token issuer a real deployment has; it needs
# bash, openssl and date.
#
#   deploy/compose/mint-token.sh EMPLOYEE ORG [TEAM] [EXPIRY_UNIX_TIME]
#
# The expiry defaults to 24 hours from now. The employee must exist in the
# cluster (policyd employee apply) for the token to be accepted.
set -euo pipefail

if (($# < 2 || $# > 4)); then
	echo "usage: $0 EMPLOYEE ORG [TEAM] [EXPIRY_UNIX_TIME]" >&2
	exit 2
fi
employee=$1 org=$2 team=${3:-} exp=${4:-$(($(date +%s) + 86400))}
for v in "$employee" "$org" "$team"; do
	if [[ $v == *[\"\\]* ]]; then
		echo "$0: quotes and backslashes are not allowed in claims" >&2
		exit 2
	fi
done
[[ $exp =~ ^[0-9]+$ ]] || { echo "$0: expiry must be a Unix time" >&2; exit 2; }

key_file="${JWT_HMAC_SECRET_FILE:-$(dirname "$0")/demo-secrets/jwt-hmac-secret}"
key="$(tr -d '[:space:]' <"$key_file")" # policyd trims the file the same way

b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

header='{"alg":"HS256","typ":"JWT"}'
claims="{\"sub\":\"$employee\",\"org\":\"$org\""
[[ -n $team ]] && claims+=",\"team\":\"$team\""
claims+=",\"exp\":$exp}"

signing_input="$(printf '%s' "$header" | b64url).$(printf '%s' "$claims" | b64url)"
signature="$(printf '%s' "$signing_input" | openssl dgst -sha256 -mac HMAC -macopt "key:$key" -binary | b64url)"
printf '%s.%s\n' "$signing_input" "$signature"
