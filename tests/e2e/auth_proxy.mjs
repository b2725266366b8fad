// A reverse proxy that adds "Authorization: <AUTH>" to every request and changes nothing else.
//
// The MCP conformance suite cannot send a bearer token, and dataref refuses HTTP without one.
// With this proxy in front, the real auth middleware stays in the request path; Host and
// Origin pass through unchanged (the DNS-rebinding checks must reach the server), and
// responses stream (SSE).
//
//   LISTEN_PORT=8803 TARGET=http://127.0.0.1:8802 AUTH="Bearer tok" node auth_proxy.mjs
import http from "node:http";

const target = new URL(process.env.TARGET);
const auth = process.env.AUTH;
const port = Number(process.env.LISTEN_PORT || 0);

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: auth };
  const upstream = http.request(
    {
      hostname: target.hostname,
      port: target.port,
      path: req.url,
      method: req.method,
      headers,
    },
    (reply) => {
      res.writeHead(reply.statusCode, reply.headers);
      reply.pipe(res);
    },
  );
  upstream.on("error", (err) => {
    if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
    res.end(`proxy: ${err.message}`);
  });
  req.pipe(upstream);
  res.on("close", () => upstream.destroy());
});

server.listen(port, "127.0.0.1", () => {
  // The test reads the port from this line.
  console.log(`listening ${server.address().port}`);
});
