// Open a notebook in JupyterLab in headless Chromium, Run -> Run All Cells, wait until every
// code cell has run, and print what the page shows as JSON: for each code cell its source,
// prompt, output texts, images, and whether an output is an error. A screenshot is saved.
//
//   node run_notebook.mjs <lab base url> <token> <notebook path> <screenshot.png> [timeout ms]
import { createRequire } from "node:module";

// playwright-core lives in the checkout's .node/ (tests/e2e/setup.sh), not beside this file.
const require = createRequire(new URL("../../.node/package.json", import.meta.url));
const { chromium } = require("playwright-core");

const [base, token, notebook, screenshot, timeoutArg] = process.argv.slice(2);
const timeout = Number(timeoutArg || 180000);
const api = (path) => `${base}${path}${path.includes("?") ? "&" : "?"}token=${token}`;

// The flags this machine's notes give for Chromium as root with a closed network.
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

async function kernelIdle() {
  const sessions = await (await fetch(api("/api/sessions"))).json();
  const mine = sessions.filter((s) => s.path === notebook);
  return mine.length === 1 && mine[0].kernel && mine[0].kernel.execution_state === "idle";
}

async function until(what, check) {
  const deadline = Date.now() + timeout;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`timed out waiting for ${what}`);
}

try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.setDefaultTimeout(60000);
  await page.goto(api(`/lab/tree/${encodeURI(notebook)}`));
  await page.locator(".jp-NotebookPanel .jp-Cell").first().waitFor();
  await until("the kernel to start", kernelIdle);

  // The menu, as a person would: Run -> Run All Cells.
  await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
  const label = page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ });
  await page.locator(".lm-Menu-item", { has: label }).click();

  const prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt");
  await until("every cell to run", async () => {
    const texts = await prompts.allInnerTexts();
    return texts.length > 0 && texts.every((t) => /\[\d+\]/.test(t)) && (await kernelIdle());
  });

  const cells = await page.locator(".jp-NotebookPanel .jp-CodeCell").evaluateAll((nodes) =>
    nodes.map((cell) => ({
      source: cell.querySelector(".jp-InputArea-editor .cm-content")?.innerText ?? "",
      prompt: cell.querySelector(".jp-InputPrompt")?.innerText ?? "",
      outputs: [...cell.querySelectorAll(".jp-OutputArea-output")].map((o) => o.innerText),
      error: cell.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]') !== null,
      images: cell.querySelectorAll(".jp-OutputArea-output img").length,
    })),
  );
  // The screenshot shows the first answer the agent got, as the notebook recomputed it.
  const answer = page.locator(".jp-NotebookPanel .jp-CodeCell", { hasText: "result =" }).first();
  await answer.scrollIntoViewIfNeeded();
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ cells }));
} finally {
  await browser.close();
}
