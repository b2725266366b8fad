// The page for people in headless Chromium: sign in with a token, watch a notebook live and
// report every cell (and chart image) the moment it appears, then take commands on stdin.
//
//   node watch_page.mjs <base url> <token> <output dir>
// stdout: one JSON object a line: {"event": "ready"}, {"event": "cell", index, tool, result,
//   t}, {"event": "image", index, t} (t: Date.now() in ms), then answers to the commands:
//   shot                  -> screenshot of the live notebook: page-notebook.png
//   lineage               -> /artifacts, screenshot page-lineage.png; {"event": "lineage", edges}
//   nocsrf <path>         -> POST <path> from the page without the CSRF token; {"event": "nocsrf", status}
//   quit
import { createRequire } from "node:module";
import readline from "node:readline";

const require = createRequire(new URL("../../.node/package.json", import.meta.url));
const { chromium } = require("playwright-core");

const [base, token, outDir] = process.argv.slice(2);
const say = (obj) => console.log(JSON.stringify(obj));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});

try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.setDefaultTimeout(60000);
  page.on("pageerror", (err) => say({ event: "pageerror", message: String(err) }));
  await page.exposeFunction("reportCell", (what) => say({ ...what, t: Date.now() }));

  await page.goto(`${base}/`);
  await page.locator('input[name="token"]').fill(token);
  await Promise.all([page.waitForURL(`${base}/`), page.locator("#signin button").click()]);
  await page.goto(`${base}/notebooks/default`);
  await page.locator("#live:not([hidden])").waitFor();  // the event stream is open
  await page.evaluate(() => {
    const feed = document.getElementById("cells");
    const seen = (cell) => {
      const index = Number(cell.dataset.index);
      window.reportCell({
        event: "cell", index, tool: cell.dataset.tool,
        result: cell.querySelector(".out.result pre")?.textContent ?? null,
      });
      for (const img of cell.querySelectorAll("img.chart")) {
        const loaded = () => window.reportCell({ event: "image", index, width: img.naturalWidth });
        if (img.complete && img.naturalWidth > 0) loaded();
        else img.addEventListener("load", loaded, { once: true });
      }
    };
    new MutationObserver((records) => {
      for (const r of records) for (const n of r.addedNodes) if (n.classList?.contains("cell")) seen(n);
    }).observe(feed, { childList: true });
  });
  say({ event: "ready" });

  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, arg] = line.trim().split(/\s+/);
    if (command === "quit") break;
    if (command === "shot") {
      await page.locator("#cells .cell-render_chart img.chart").last().scrollIntoViewIfNeeded();
      await page.screenshot({ path: `${outDir}/page-notebook.png` });
      say({ event: "shot" });
    } else if (command === "lineage") {
      await page.goto(`${base}/artifacts`);
      await page.locator("svg#lineage").waitFor();
      await page.locator("svg#lineage").scrollIntoViewIfNeeded();
      await page.screenshot({ path: `${outDir}/page-lineage.png` });
      const edges = await page.locator("svg#lineage path.edge").evaluateAll((paths) =>
        paths.map((p) => [p.dataset.source, p.dataset.target]));
      say({ event: "lineage", edges });
    } else if (command === "nocsrf") {
      const status = await page.evaluate(async (path) => {
        const r = await fetch(path, { method: "POST", body: new URLSearchParams({}) });
        return r.status;
      }, arg);
      say({ event: "nocsrf", status });
    }
  }
} finally {
  await browser.close();
}
