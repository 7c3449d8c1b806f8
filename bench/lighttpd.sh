#!/bin/sh
# lighttpd as a `corelocal bench compare` peer: serves the same 6-byte /hello as the nginx and
# corelocal-http presets, one process, no modules, keep-alive without a request cap.
#   corelocal bench compare --peer nginx --peer corelocal-http \
#       --server "lighttpd=http:sh bench/lighttpd.sh {port}" --workload crr
set -eu
port=${1:-8080}
dir=$(mktemp -d /tmp/corelocal-lighttpd.XXXXXX)
mkdir -p "$dir/www"
printf 'hello\n' > "$dir/www/hello"
cat > "$dir/lighttpd.conf" <<CONF
server.document-root = "$dir/www"
server.bind = "127.0.0.1"
server.port = $port
server.max-fds = 16384
server.max-connections = 8192
server.max-keep-alive-requests = 1000000
server.max-keep-alive-idle = 60
server.errorlog = "$dir/error.log"
server.feature-flags += ("server.h2proto" => "disable")
mimetype.assign = ("" => "text/plain")
server.modules = ()
CONF
exec lighttpd -D -f "$dir/lighttpd.conf"
