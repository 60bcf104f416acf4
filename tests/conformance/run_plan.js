// A client no one at simsearch wrote: @grpc/grpc-js and @grpc/proto-loader run a plan of calls
// (JSON on stdin, made by tests/service/test_conformance.py) against a node and print what each
// call answered (JSON on stdout). No call carries a deadline, as grpc-js sends none by default.
//
// plan: {address, protos: [paths], include_dirs: [dirs], steps: [{service, method, token,
//        request | requests | raw}]}; bytes fields are base64 strings, as in proto3's JSON.
// answer per step: {code, details, responses: [objects]} (code: the status name).
'use strict';
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const STATUS = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

function readStdin() {
  return new Promise((resolve) => {
    let s = '';
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (d) => { s += d; });
    process.stdin.on('end', () => resolve(s));
  });
}

function metadataFor(step) {
  const md = new grpc.Metadata();
  if (step.token !== undefined && step.token !== null) md.set('authorization', step.token);
  return md;
}

function runStep(client, defs, step) {
  const def = defs[step.service][step.method];
  if (!def) throw new Error(`no method ${step.service}/${step.method}`);
  const raw = step.raw !== undefined;
  const serialize = raw ? (b) => b : def.requestSerialize;
  const first = raw ? Buffer.from(step.raw, 'base64') : step.request;
  const requests = step.requests || [first];
  const md = metadataFor(step);
  const responses = [];
  return new Promise((resolve) => {
    const done = (err) => resolve({
      code: err ? STATUS[err.code] : 'OK',
      details: err ? err.details : '',
      responses,
    });
    if (!def.requestStream && !def.responseStream) {
      client.makeUnaryRequest(def.path, serialize, def.responseDeserialize, requests[0], md,
        (err, resp) => { if (!err) responses.push(resp); done(err); });
    } else if (!def.requestStream) {
      const call = client.makeServerStreamRequest(def.path, serialize, def.responseDeserialize,
        requests[0], md);
      let failed = null;
      call.on('data', (r) => responses.push(r));
      call.on('error', (e) => { failed = e; });
      call.on('status', (s) => done(s.code === grpc.status.OK ? failed : s));
    } else if (!def.responseStream) {
      const call = client.makeClientStreamRequest(def.path, serialize, def.responseDeserialize,
        md, (err, resp) => { if (!err) responses.push(resp); done(err); });
      for (const r of requests) call.write(r);
      call.end();
    } else {
      const call = client.makeBidiStreamRequest(def.path, serialize, def.responseDeserialize, md);
      let failed = null;
      call.on('data', (r) => responses.push(r));
      call.on('error', (e) => { failed = e; });
      call.on('status', (s) => done(s.code === grpc.status.OK ? failed : s));
      for (const r of requests) call.write(r);
      call.end();
    }
  });
}

async function main() {
  const plan = JSON.parse(await readStdin());
  const defs = protoLoader.loadSync(plan.protos, {
    keepCase: true, longs: String, enums: String, bytes: String, defaults: false,
    includeDirs: plan.include_dirs || [],
  });
  // grpc-js's own limits, not the server's: the server's are what the plan tests
  const client = new grpc.Client(plan.address, grpc.credentials.createInsecure(), {
    'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': -1,
  });
  const out = [];
  for (const step of plan.steps) out.push(await runStep(client, defs, step));
  client.close();
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(2); });
