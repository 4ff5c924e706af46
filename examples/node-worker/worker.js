#!/usr/bin/env node
// An AWP worker in Node.js, written against nothing but the shared protos
// (protos/awp/v1/worker.proto) and @grpc/grpc-js. It shows what any language needs
// to take part in an AWP cluster (DESIGN.md §4, §8):
//
//   Register    -> a session (worker id + secret session token)
//   Heartbeat   -> one bidirectional stream for the whole session; every interval it
//                  lists the leases held, the server answers RENEWED / REVOKED / UNKNOWN
//   Claim       -> a long poll for up to "free slots" leases
//   Complete    -> the result, fenced by the lease token (LEASE_LOST if it was lost)
//   Drain       -> on SIGTERM: stop claiming, finish what runs, drain again -> STOPPED
//
// It runs the "mock" executor kind: the output echoes the input, and the input may ask
// for a sleep (sleep_ms), a permanent failure (fail) or retryable failures
// (fail_attempts: N fails while attempt <= N) -- the same contract as awp-worker's.
//
// Usage:
//   node worker.js --server 127.0.0.1:50051 --worker-token $AWP_WORKER_TOKEN [--name n]
//                  [--concurrency 4] [--shutdown-grace 30] [--safety-margin 1]
// Every flag also reads an environment variable: AWP_SERVER, AWP_WORKER_TOKEN,
// AWP_WORKER_NAME, AWP_WORKER_CONCURRENCY, AWP_WORKER_SHUTDOWN_GRACE,
// AWP_WORKER_SAFETY_MARGIN.
//
// Exit codes: 0 after a clean drain; 1 on an internal failure; 3 when the server
// refuses the session for good (bad token, session offline): a process manager should
// start it again, and it registers anew.
//
// Modules: config.js (flags, logs), protocol.js (the protos, rich errors, Struct and
// Duration), mock.js (the executor); this file is the worker's protocol loop.

'use strict';

const grpc = require('@grpc/grpc-js');
const { config, channel, log, EXIT_OK, EXIT_FAILURE, EXIT_SESSION_LOST } = require('./config');
const {
  awp,
  PROTOCOL_VERSION,
  WORKER_DRAINING,
  errorReason,
  isPermanent,
  fromStruct,
  toStruct,
  ms,
  durationOf,
} = require('./protocol');
const { sleep, PermanentError, mockExecute } = require('./mock');

class Worker {
  constructor(cfg) {
    this.cfg = cfg;
    const { credentials, options } = channel(cfg);
    this.client = new awp.WorkerService(cfg.server, credentials, {
      ...options,
      // Find a restarted server quickly (the defaults back off to minutes).
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 1000,
    });
    this.metadata = new grpc.Metadata();
    if (cfg.token) this.metadata.set('authorization', `Bearer ${cfg.token}`);
    this.session = null;
    this.heartbeatMs = 5000;
    this.leases = new Map(); // dispatch_id -> held lease (see claimed())
    this.draining = false;
    this.stopped = false;
    this.slotFreed = null; // resolves when a lease is released (wakes the claim loop)
    this.inflight = new Set();
    this.finished = new Promise((resolve) => (this.finish = resolve));
  }

  deadline(millis = this.cfg.rpcTimeoutMs) {
    return new Date(Date.now() + millis);
  }

  // A unary call as a promise. In-flight calls are remembered so that exit() can cancel
  // them: a parked Claim would otherwise keep the process alive until its wait ends.
  call(method, request, timeoutMs) {
    return new Promise((resolve, reject) => {
      const options = { deadline: this.deadline(timeoutMs) };
      const call = this.client[method](request, this.metadata, options, (err, res) => {
        this.inflight.delete(call);
        return err ? reject(err) : resolve(res);
      });
      this.inflight.add(call);
    });
  }

  // Transient failures are retried with capped, jittered exponential backoff.
  async withRetry(what, fn) {
    for (let delay = 100; ; delay = Math.min(delay * 2, 5000)) {
      try {
        return await fn();
      } catch (error) {
        if (this.stopped || isPermanent(error)) throw error;
        if (error.code === grpc.status.INVALID_ARGUMENT) throw error; // our bug: retrying won't help
        log('warning', `${what} failed; retrying`, { code: error.code, error: error.details });
        await sleep(delay / 2 + Math.random() * (delay / 2));
      }
    }
  }

  async register() {
    const response = await this.withRetry('Register', () =>
      this.call('Register', {
        name: this.cfg.name,
        protocol_version: PROTOCOL_VERSION,
        executor_kinds: ['mock'],
        max_concurrency: this.cfg.concurrency,
        labels: { language: 'node' },
      }),
    );
    this.session = response.session;
    this.heartbeatMs = ms(response.heartbeat_interval) || this.heartbeatMs;
    log('info', 'registered', {
      worker_id: this.session.worker_id,
      name: this.cfg.name,
      heartbeat_ms: this.heartbeatMs,
      lease_ttl_ms: ms(response.lease_ttl),
    });
  }

  // --- heartbeat: one stream for the session's whole life, reconnected when it breaks ---

  heartbeat() {
    let backoff = 50;
    const open = () => {
      if (this.stopped) return;
      const stream = this.client.Heartbeat(this.metadata);
      let timer = null;
      const send = () => {
        const leases = [...this.leases.values()].map((h) => ({
          dispatch_id: h.lease.dispatch_id,
          lease_token: h.lease.lease_token,
        }));
        stream.write({ session: this.session, leases });
      };
      stream.on('data', (response) => {
        backoff = 50; // a healthy answer resets the reconnect backoff
        this.onHeartbeat(response, Date.now());
      });
      let closed = false;
      const reconnect = (why) => {
        // 'error' and 'end' can both fire for one broken stream: reconnect once.
        if (closed) return;
        closed = true;
        clearInterval(timer);
        if (this.stopped) return;
        if (why && isPermanent(why)) return this.sessionLost(why);
        // Reconnect at once-ish: within the server's stream grace the leases survive.
        // Capped at the heartbeat interval: the server marks a session offline after a
        // few silent intervals, so keep knocking at least that often.
        const delay = backoff / 2 + Math.random() * (backoff / 2);
        backoff = Math.min(backoff * 2, this.heartbeatMs, 2000);
        log('info', 'heartbeat stream closed; reconnecting', { error: why && why.details });
        setTimeout(open, delay);
      };
      stream.on('error', reconnect);
      stream.on('end', () => reconnect(null));
      this.heartbeatStream = stream;
      send(); // current leases first, so a reconnect renews them immediately
      timer = setInterval(send, this.heartbeatMs);
      this.stopHeartbeat = () => {
        clearInterval(timer);
        stream.removeAllListeners('error');
        stream.removeAllListeners('end');
        stream.on('error', () => {});
        stream.end();
        stream.cancel();
      };
    };
    open();
  }

  onHeartbeat(response, now) {
    if (response.session_state === 'WORKER_STATE_OFFLINE') {
      return this.sessionLost(new Error('the server marked this session offline'));
    }
    for (const answer of response.leases) {
      const held = this.leases.get(answer.dispatch_id);
      if (!held) continue;
      if (answer.status === 'LEASE_STATUS_RENEWED') {
        this.armSafetyTimer(held, now, ms(answer.lease_remaining), ms(answer.attempt_remaining));
      } else if (held.reporting) {
        // A heartbeat that crossed our Complete on the wire: the server may already have
        // recorded the result (so the lease is no longer live). Complete's answer decides.
        continue;
      } else {
        // REVOKED (canceled, expired) or UNKNOWN: stop, and report nothing.
        log('warning', 'lease revoked; stopping it', {
          dispatch_id: held.lease.dispatch_id,
          status: answer.status,
        });
        this.release(held, 'revoked');
      }
    }
  }

  // The local safety deadline: min(lease, attempt) remaining minus the margin, measured
  // from when the answer arrived (durations, never the server's absolute clock). If no
  // renewal moves it in time -- the server or its database is unreachable -- the work
  // stops: this worker can no longer prove it still owns the lease.
  armSafetyTimer(held, now, leaseRemainingMs, attemptRemainingMs) {
    const windowMs = Math.min(leaseRemainingMs, attemptRemainingMs || Infinity);
    const margin = Math.min(this.cfg.safetyMarginMs, windowMs / 2);
    clearTimeout(held.safetyTimer);
    held.safetyTimer = setTimeout(() => {
      log('warning', 'safety deadline passed: execution cancelled, nothing reported', {
        dispatch_id: held.lease.dispatch_id,
      });
      this.release(held, 'safety deadline');
    }, Math.max(0, now + windowMs - margin - Date.now()));
  }

  release(held, reason) {
    if (this.leases.get(held.lease.dispatch_id) !== held) return;
    this.leases.delete(held.lease.dispatch_id);
    clearTimeout(held.safetyTimer);
    held.abort.abort(new Error(reason));
    if (this.slotFreed) this.slotFreed();
  }

  // --- claiming ---------------------------------------------------------------------------

  async claimLoop() {
    let backoff = 250;
    while (!this.draining && !this.stopped) {
      const free = this.cfg.concurrency - this.leases.size;
      if (free <= 0) {
        await new Promise((resolve) => (this.slotFreed = resolve));
        this.slotFreed = null;
        continue;
      }
      let response;
      try {
        response = await this.call(
          'Claim',
          { session: this.session, max_leases: free, wait: durationOf(this.cfg.claimWaitMs) },
          this.cfg.claimWaitMs + this.cfg.rpcTimeoutMs,
        );
      } catch (error) {
        const reason = errorReason(error);
        if (this.stopped || reason === WORKER_DRAINING) return; // no more claims
        if (isPermanent(error)) return this.sessionLost(error);
        log('warning', 'Claim failed; backing off', { code: error.code, reason, error: error.details });
        await sleep(backoff / 2 + Math.random() * (backoff / 2));
        backoff = Math.min(backoff * 2, 5000);
        continue;
      }
      backoff = 250;
      // An empty answer is normal: the server already held the long poll.
      for (const lease of response.leases) this.claimed(lease);
    }
  }

  claimed(lease) {
    const held = { lease, abort: new AbortController(), safetyTimer: null, reporting: false };
    this.leases.set(lease.dispatch_id, held);
    this.armSafetyTimer(held, Date.now(), ms(lease.lease_remaining), ms(lease.attempt_remaining));
    this.execute(held); // runs concurrently; its promise never rejects
  }

  async execute(held) {
    const { lease } = held;
    const fields = {
      dispatch_id: lease.dispatch_id,
      run_id: lease.run_id,
      task_key: lease.task_key,
      attempt: lease.attempt,
      fencing_token: lease.fencing_token,
    };
    log('info', 'executing', fields);
    let result;
    try {
      const output = await mockExecute(lease, fromStruct(lease.input), held.abort.signal);
      result = { outcome: 'RESULT_OUTCOME_SUCCEEDED', output: toStruct(output) };
    } catch (error) {
      if (held.abort.signal.aborted) return; // revoked / safety deadline: report nothing
      result = {
        outcome: 'RESULT_OUTCOME_FAILED',
        error: { message: String(error.message || error), retryable: !(error instanceof PermanentError) },
      };
    }
    if (this.leases.get(lease.dispatch_id) !== held) return; // lost while finishing
    held.reporting = true;
    await this.complete(held, result, fields);
  }

  async complete(held, result, fields) {
    const request = {
      session: this.session,
      results: [Object.assign({ dispatch_id: held.lease.dispatch_id, lease_token: held.lease.lease_token }, result)],
    };
    try {
      // A lost response is retried with the same token and result: the server answers
      // DUPLICATE, never applies it twice. Stop retrying once the lease is given up.
      const response = await this.withRetry('Complete', () => {
        if (this.leases.get(held.lease.dispatch_id) !== held) throw Object.assign(new Error('lease given up'), { gaveUp: true });
        return this.call('Complete', request);
      });
      const outcome = response.answers[0].outcome;
      const ok = outcome === 'COMPLETE_OUTCOME_ACCEPTED' || outcome === 'COMPLETE_OUTCOME_DUPLICATE';
      log(ok ? 'info' : 'warning', 'completed', Object.assign({ outcome }, fields));
    } catch (error) {
      if (!error.gaveUp) {
        if (isPermanent(error)) this.sessionLost(error);
        else log('error', 'Complete failed', Object.assign({ error: String(error.message) }, fields));
      }
    } finally {
      this.release(held, 'completed');
    }
  }

  // --- shutdown ---------------------------------------------------------------------------

  // SIGTERM: Drain (no new claims; heartbeats and completes go on), let running leases
  // finish within the shutdown timeout, hand back whatever still runs, Drain again.
  async drain() {
    if (this.draining) return;
    this.draining = true;
    if (this.slotFreed) this.slotFreed();
    log('info', 'draining', { leases: this.leases.size, timeout_ms: this.cfg.shutdownGraceMs });
    try {
      if (!this.session) return this.exit(EXIT_OK);
      await this.withRetry('Drain', () => this.call('Drain', { session: this.session, hand_back: [] }));
      const until = Date.now() + this.cfg.shutdownGraceMs;
      while (this.leases.size > 0 && Date.now() < until) await sleep(50);
      const handBack = [...this.leases.values()].map((h) => ({
        dispatch_id: h.lease.dispatch_id,
        lease_token: h.lease.lease_token,
      }));
      for (const held of [...this.leases.values()]) this.release(held, 'shutdown');
      const response = await this.withRetry('Drain', () =>
        this.call('Drain', { session: this.session, hand_back: handBack }),
      );
      log('info', 'drained', { state: response.session_state, handed_back: handBack.length });
      this.exit(EXIT_OK);
    } catch (error) {
      log('error', 'drain failed', { error: String(error.message || error) });
      this.exit(EXIT_FAILURE);
    }
  }

  sessionLost(error) {
    if (this.draining && this.leases.size === 0) {
      // Our own Drain stopped the session once no lease was left; the server now refuses
      // it. That is the end we asked for, not a lost session.
      log('info', 'session stopped by drain');
      return this.exit(EXIT_OK);
    }
    log('error', 'session lost for good; exiting so a supervisor can start a new one', {
      reason: errorReason(error),
      error: String(error.details || error.message || error),
    });
    this.exit(EXIT_SESSION_LOST);
  }

  exit(code) {
    if (this.stopped) return;
    this.stopped = true;
    for (const held of [...this.leases.values()]) this.release(held, 'exit');
    if (this.stopHeartbeat) this.stopHeartbeat();
    for (const call of this.inflight) call.cancel();
    this.client.close();
    this.finish(code);
  }

  async run() {
    try {
      await this.register();
    } catch (error) {
      this.sessionLost(error);
      return this.finished;
    }
    this.heartbeat();
    this.claimLoop().catch((error) => {
      log('error', 'claim loop failed', { error: String(error.stack || error) });
      this.exit(EXIT_FAILURE);
    });
    return this.finished;
  }
}

const worker = new Worker(config);
process.on('SIGTERM', () => worker.drain());
process.on('SIGINT', () => worker.drain());
worker.run().then((code) => {
  log('info', 'exiting', { code });
  process.exitCode = code;
});
