#!/usr/bin/env bash
# Install what the LDAP and service tests need from Debian: slapd + ldap-utils (a private
# directory server on loopback, started by tests/ldap_server.py; the system slapd is stopped
# and disabled so it holds no port) and chromium (the admin page screenshot). Idempotent.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# slapd's postinst asks for a password and starts the system server: answer non-interactively
if ! dpkg-query -W -f='${Status}' slapd 2>/dev/null | grep -q 'install ok installed'; then
  echo "slapd slapd/no_configuration boolean true" | debconf-set-selections 2>/dev/null || true
fi
apt_install slapd ldap-utils chromium
# the packaged server is not used; tests run their own on a free loopback port
if command -v systemctl >/dev/null && systemctl is-active -q slapd 2>/dev/null; then
  systemctl stop slapd || true
fi
command -v slapd >/dev/null || [ -x /usr/sbin/slapd ] || die "slapd missing after install"
command -v chromium >/dev/null || die "chromium missing after install"
log "slapd $(/usr/sbin/slapd -VV 2>&1 | sed -n 's/.*slapd \([0-9.]*\).*/\1/p' | head -1), $(chromium --version 2>/dev/null)"
