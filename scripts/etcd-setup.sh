#!/usr/bin/env bash
# Makes sure the `etcd` feature can be built and tested here: `protoc` and the
# well-known protobuf types (etcd-client's build needs both), the `etcd` binary
# (the integration tests start a 3-member cluster on 127.0.0.1), and `iptables`
# (the fault suite partitions etcd with DROP rules on loopback; it runs as root).
#
# Installs what is missing with apt-get when it can (as root, or with passwordless
# sudo); otherwise fails, saying what to install.
set -euo pipefail

packages="etcd-server etcd-client protobuf-compiler libprotobuf-dev iptables"

missing() {
  local need=()
  command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
  [ -e /usr/include/google/protobuf/timestamp.proto ] || need+=(libprotobuf-dev)
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
  command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
  echo "${need[*]:-}"
}

need=$(missing)
if [ -z "$need" ]; then
  echo "etcd feature prerequisites present: $(command -v etcd), $(command -v protoc)"
  exit 0
fi

echo "etcd feature prerequisites missing: $need"
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[0]:-}" != none ]; then
    echo "installing: $packages"
    "${as_root[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq $packages
    need=$(missing)
    if [ -z "$need" ]; then
      echo "installed: $(command -v etcd) ($(etcd --version | head -1)), $(protoc --version)"
      exit 0
    fi
    echo "still missing after apt-get install: $need" >&2
  fi
fi

{
  echo "error: the etcd feature needs $need, and this script could not install it."
  echo "Install (Debian/Ubuntu, as root):"
  echo "    apt-get update && apt-get install -y $packages"
  echo "or put an etcd binary on PATH (or in \$ETCD_BIN) and protoc with the protobuf"
  echo "well-known types (\$PROTOC / \$PROTOC_INCLUDE)."
} >&2
exit 1
