// A client refuses a target without a port: gRPC would dial port 443 of a bare host (issue 31).
import assert from "node:assert/strict";
import { test } from "node:test";

import { checkAddress, SessionLogClient } from "sessionlog-client";

test("a target without a port is refused at once, naming HOST:PORT", () => {
  for (const target of ["127.0.0.1", "localhost", "[::1]", "127.0.0.1:", "h:http", "h:0", "h:70000"]) {
    assert.throws(() => new SessionLogClient(target), {
      name: "TypeError",
      message: new RegExp(`HOST:PORT, e\\.g\\. 127\\.0\\.0\\.1:50051 \\(got ${JSON.stringify(target).replace(/[[\]]/g, "\\$&")}\\)`),
    });
    assert.throws(() => new SessionLogClient(["127.0.0.1:50051", target]), /port 443/);
  }
});

test("targets with a port or a scheme are kept", () => {
  for (const target of ["127.0.0.1:50051", "[::1]:50051", "dns:///localhost:50051", "unix:/tmp/s.sock", "ipv4:127.0.0.1:1"]) {
    assert.equal(checkAddress(target), target);
    new SessionLogClient(target).close();
  }
});

test("a dns: target without a port and a URL are refused", () => {
  for (const target of ["dns:///127.0.0.1", "dns:127.0.0.1", "dns://127.0.0.1/localhost"]) {
    assert.throws(() => new SessionLogClient(target), /port 443/);
  }
  for (const target of ["http://127.0.0.1:50051", "https://h:443", "grpc://h:1"]) {
    assert.throws(() => new SessionLogClient(target), /a URL is not a gRPC target/);
  }
  assert.equal(checkAddress("dns:localhost:50051"), "dns:localhost:50051");
});
