// The "mock" executor kind, and an abortable sleep.

'use strict';

const sleep = (millis, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, millis);
    if (signal) {
      signal.addEventListener(
        'abort',
        () => {
          clearTimeout(timer);
          reject(signal.reason);
        },
        { once: true },
      );
    }
  });

class PermanentError extends Error {}

// Whatever the executor does, it must stop when `signal` aborts: the lease is gone (or
// may be), and work without ownership is exactly what fencing exists to prevent.
async function mockExecute(lease, input, signal) {
  if (typeof input.sleep_ms === 'number' && input.sleep_ms > 0) await sleep(input.sleep_ms, signal);
  if (input.fail) throw new PermanentError(typeof input.fail === 'string' ? input.fail : 'mock failure');
  if (typeof input.fail_attempts === 'number' && lease.attempt <= input.fail_attempts) {
    throw new Error(`mock retryable failure: attempt ${lease.attempt} <= ${input.fail_attempts}`);
  }
  return { action: lease.action, echo: input, attempt: lease.attempt, worker: 'node' };
}

// --- the worker -------------------------------------------------------------------------

module.exports = { sleep, PermanentError, mockExecute };
