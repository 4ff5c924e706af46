// The awp.v1 protocol as a Node program sees it: the WorkerService client loaded from the
// shared protos, the rich error details, Struct and Duration conversion.

'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PROTOCOL_VERSION = 1;

// keepCase: field names exactly as in the .proto (dispatch_id, lease_token...).
// longs: String -- int64 ids and fencing tokens exceed JavaScript's safe integers in
// principle; they are passed back untouched, never computed with.
// The google/protobuf well-known types (Struct, Duration, Timestamp) ship with
// proto-loader; includeDirs only has to find awp/v1/*.
const PROTOS = path.join(__dirname, '..', '..', 'protos');
const definition = protoLoader.loadSync('awp/v1/worker.proto', {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTOS],
});
const awp = grpc.loadPackageDefinition(definition).awp.v1;

// Errors carry a google.rpc.Status in the "grpc-status-details-bin" trailer with a
// google.rpc.ErrorInfo whose `reason` is stable (SESSION_INVALID, WORKER_DRAINING...).
// Branch on that, never on message text. Two tiny message types are all it takes.
const rpcTypes = protobuf.Root.fromJSON({
  nested: {
    Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
    Status: {
      fields: {
        code: { type: 'int32', id: 1 },
        message: { type: 'string', id: 2 },
        details: { rule: 'repeated', type: 'Any', id: 3 },
      },
    },
    ErrorInfo: {
      fields: {
        reason: { type: 'string', id: 1 },
        domain: { type: 'string', id: 2 },
        metadata: { keyType: 'string', type: 'string', id: 3 },
      },
    },
  },
});
const StatusType = rpcTypes.lookupType('Status');
const ErrorInfoType = rpcTypes.lookupType('ErrorInfo');

function errorReason(error) {
  const raw = error && error.metadata ? error.metadata.get('grpc-status-details-bin') : [];
  for (const bytes of raw) {
    const status = StatusType.decode(bytes);
    for (const detail of status.details) {
      if (detail.type_url.endsWith('/google.rpc.ErrorInfo')) {
        return ErrorInfoType.decode(detail.value).reason;
      }
    }
  }
  return '';
}

// The reasons come from protos/awp/v1/errors.proto: ErrorInfo.reason is an ErrorReason
// value's name without its ERROR_REASON_ prefix. A name the proto lacks fails at start.
const ErrorReason = protobuf
  .loadSync(path.join(PROTOS, 'awp', 'v1', 'errors.proto'))
  .lookupEnum('awp.v1.ErrorReason');
function reason(name) {
  if (!(`ERROR_REASON_${name}` in ErrorReason.values)) throw new Error(`no ErrorReason ${name}`);
  return name;
}

// Permanent for this session: register anew (DESIGN.md §4). Everything else -- above
// all UNAVAILABLE and DEADLINE_EXCEEDED -- is transient: retry.
const PERMANENT_REASONS = new Set(
  ['SESSION_INVALID', 'PROTOCOL_UNSUPPORTED', 'TOKEN_INVALID'].map(reason),
);
const WORKER_DRAINING = reason('WORKER_DRAINING');
function isPermanent(error) {
  return PERMANENT_REASONS.has(errorReason(error));
}

// google.protobuf.Struct <-> plain JSON. proto-loader hands Structs over as messages
// ({fields: {k: {kind: 'stringValue', stringValue: 'x'}}}), not as JSON objects.
function fromValue(value) {
  switch (value.kind) {
    case 'nullValue':
      return null;
    case 'numberValue':
      return value.numberValue;
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return value.boolValue;
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return (value.listValue.values || []).map(fromValue);
    default:
      return null;
  }
}
function fromStruct(struct) {
  const out = {};
  for (const [key, value] of Object.entries((struct && struct.fields) || {})) {
    out[key] = fromValue(value);
  }
  return out;
}
function toValue(json) {
  if (json === null || json === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof json === 'number') return { numberValue: json };
  if (typeof json === 'string') return { stringValue: json };
  if (typeof json === 'boolean') return { boolValue: json };
  if (Array.isArray(json)) return { listValue: { values: json.map(toValue) } };
  return { structValue: toStruct(json) };
}
function toStruct(json) {
  const fields = {};
  for (const [key, value] of Object.entries(json)) fields[key] = toValue(value);
  return { fields };
}

const ms = (duration) =>
  duration ? Number(duration.seconds || 0) * 1000 + Math.floor((duration.nanos || 0) / 1e6) : 0;
const durationOf = (millis) => ({
  seconds: String(Math.floor(millis / 1000)),
  nanos: (millis % 1000) * 1e6,
});

module.exports = {
  awp,
  PROTOCOL_VERSION,
  WORKER_DRAINING,
  errorReason,
  isPermanent,
  fromStruct,
  toStruct,
  ms,
  durationOf,
};
