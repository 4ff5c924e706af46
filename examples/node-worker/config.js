// The worker's settings (flags, each with its environment variable) and its log lines.

'use strict';

const grpc = require('@grpc/grpc-js');
const fs = require('fs');
const os = require('os');

const EXIT_OK = 0;
const EXIT_FAILURE = 1;
const EXIT_SESSION_LOST = 3;

// --- configuration --------------------------------------------------------------------

function flag(name, envName, fallback) {
  const index = process.argv.indexOf(`--${name}`);
  if (index !== -1 && index + 1 < process.argv.length) return process.argv[index + 1];
  return process.env[envName] !== undefined ? process.env[envName] : fallback;
}

const config = {
  server: flag('server', 'AWP_SERVER', '127.0.0.1:50051'),
  token: flag('worker-token', 'AWP_WORKER_TOKEN', ''),
  name: flag('name', 'AWP_WORKER_NAME', `${os.hostname()}-node-${process.pid}`),
  concurrency: Number(flag('concurrency', 'AWP_WORKER_CONCURRENCY', '4')),
  shutdownGraceMs: 1000 * Number(flag('shutdown-grace', 'AWP_WORKER_SHUTDOWN_GRACE', '30')),
  safetyMarginMs: 1000 * Number(flag('safety-margin', 'AWP_WORKER_SAFETY_MARGIN', '1')),
  claimWaitMs: 5000,
  rpcTimeoutMs: 10000,
  // TLS as the Python worker takes it: a CA file turns it on; a certificate and key make
  // it mutual; a server name overrides the address's host for the certificate check.
  tls: ['1', 'true', 'yes'].includes(String(flag('tls', 'AWP_TLS', '')).toLowerCase()),
  tlsCaFile: flag('tls-ca-file', 'AWP_TLS_CA_FILE', ''),
  tlsCertFile: flag('tls-cert-file', 'AWP_TLS_CERT_FILE', ''),
  tlsKeyFile: flag('tls-key-file', 'AWP_TLS_KEY_FILE', ''),
  tlsServerName: flag('tls-server-name', 'AWP_TLS_SERVER_NAME', ''),
};

// The channel credentials and options the settings ask for.
function channel(cfg) {
  const tlsOn = cfg.tls || cfg.tlsCaFile || cfg.tlsCertFile || cfg.tlsServerName;
  if (!tlsOn) return { credentials: grpc.credentials.createInsecure(), options: {} };
  const read = (file) => (file ? fs.readFileSync(file) : null);
  const credentials = grpc.credentials.createSsl(
    read(cfg.tlsCaFile),
    read(cfg.tlsKeyFile),
    read(cfg.tlsCertFile),
  );
  const options = cfg.tlsServerName ? { 'grpc.ssl_target_name_override': cfg.tlsServerName } : {};
  return { credentials, options };
}

// One JSON object per line, like the Python processes, so one tool reads all logs.
function log(level, msg, fields = {}) {
  const line = { ts: new Date().toISOString(), level, logger: 'awp.node-worker', msg };
  process.stdout.write(JSON.stringify(Object.assign(line, fields)) + '\n');
}

module.exports = { config, channel, log, EXIT_OK, EXIT_FAILURE, EXIT_SESSION_LOST };
