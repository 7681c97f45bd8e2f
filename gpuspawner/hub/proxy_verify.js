// gpuspawner: configurable-http-proxy accepts for a server's route only that server's own
// certificate (docs/slurm-backend.md, "How the hub learns the port").
//
// Loaded into the proxy's node process with `NODE_OPTIONS=--require <this file>`
// (gpuspawner.hub.proxy.GPUProxy does it for a proxy the hub starts). The hub gives each
// GPUSpawner server with internal_ssl the route target
//   https://<label>.<address>.server.gpuspawner.internal:<port>
// where <label> is the 32 hex digits of the server's own name
// (<label>.server.gpuspawner.internal, which that server's certificate alone carries) and
// <address> the node's (or container's) address: an IPv4 address or a DNS name as it is, an
// IPv6 address as "ip6-" and its 32 hex digits. Every TLS connection node makes goes through
// tls.connect (lib/https.js calls `tls.connect(options)` on the module object at each
// connection, so this wrapper applies). For such a host it connects to <address> and checks
// the certificate against <label>.server.gpuspawner.internal, whatever the request's Host
// header says: a listener with any other certificate of the hub's CA (another user's server
// that bound the port after this one exited, or got the same address and port) is refused
// and the proxy answers 503. Any other host is left as it is. Without this file the name does
// not resolve: the route fails closed (503), it never reaches another server.
"use strict";

const tls = require("tls");

const ZONE = ".server.gpuspawner.internal";
const LABEL = /^[0-9a-f]{32}$/;
const IP6 = /^ip6-([0-9a-f]{32})$/;

// {address, servername} of a route host in the zone, null for any other host; throws for a
// malformed one (never connect somewhere a route did not say)
function decode(host) {
  if (typeof host !== "string") return null;
  const lower = host.toLowerCase();
  if (!lower.endsWith(ZONE)) return null;
  const rest = lower.slice(0, -ZONE.length);
  const dot = rest.indexOf(".");
  const label = dot < 0 ? rest : rest.slice(0, dot);
  let address = dot < 0 ? "" : rest.slice(dot + 1);
  if (!LABEL.test(label) || !address) {
    throw new Error(`gpuspawner: ${host} is not <label>.<address>${ZONE}`);
  }
  const six = IP6.exec(address);
  if (six) {
    address = six[1].match(/.{4}/g).join(":");
  }
  return { address, servername: label + ZONE };
}

const connect = tls.connect;

// tls.connect(options[, cb]) or (port[, host][, options][, cb]), as node reads them: an
// options object after the port wins over the host argument
function connectOptions(args) {
  if (args[0] !== null && typeof args[0] === "object") {
    return { options: { ...args[0] }, cb: args[1] };
  }
  const options = { port: args[0] };
  let k = 1;
  if (typeof args[k] === "string") options.host = args[k++];
  if (args[k] !== null && typeof args[k] === "object") Object.assign(options, args[k++]);
  return { options, cb: args[k] };
}

tls.connect = function gpuspawnerConnect(...args) {
  const { options, cb } = connectOptions(args);
  const route = decode(options.host);
  if (route === null) {
    return connect.apply(this, args);
  }
  Object.assign(options, {
    host: route.address,
    servername: route.servername,
    rejectUnauthorized: true,
    checkServerIdentity: (_, cert) => tls.checkServerIdentity(route.servername, cert),
  });
  return cb === undefined ? connect.call(this, options) : connect.call(this, options, cb);
};

module.exports = { decode };
