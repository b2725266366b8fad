// The live notebook: server-sent events carry the HTML of each new or changed cell.
// No framework, no build step; the server renders every cell.
"use strict";

function liveNotebook(feed) {
  const badge = document.getElementById("live");
  const source = new EventSource(feed.dataset.events);
  source.addEventListener("ready", () => { if (badge) badge.hidden = false; });
  source.addEventListener("error", () => { if (badge) badge.hidden = true; });
  source.addEventListener("cell", (event) => {
    const { index, version, html } = JSON.parse(event.data);
    const old = document.getElementById(`cell-${index}`);
    if (old && old.dataset.version === version) return;  // the page has this one already
    const holder = document.createElement("template");
    holder.innerHTML = html;
    const cell = holder.content.firstElementChild;
    if (old) {
      old.replaceWith(cell);
      return;
    }
    const next = [...feed.children].find((c) => Number(c.dataset.index) > index);
    feed.insertBefore(cell, next || null);
    cell.classList.add("new");
    if (window.scrollY + window.innerHeight >= document.body.scrollHeight - 200) {
      cell.scrollIntoView({ block: "end" });
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const feed = document.getElementById("cells");
  if (feed && feed.dataset.events) liveNotebook(feed);
  for (const form of document.querySelectorAll("form.inline")) {
    const button = form.querySelector("button.danger");
    if (button) {
      form.addEventListener("submit", (event) => {
        if (!window.confirm("Drop this artifact? It cannot be undone.")) event.preventDefault();
      });
    }
  }
});
