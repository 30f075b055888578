// The pages of aaa_celery's web integrations (Flask and Django): served as a static file,
// under a Content-Security-Policy that forbids inline script.
//
// Every value that comes from a run (call ids, tool names, arguments, results: the model's
// strings) reaches the page only through textContent, DOM properties and encodeURIComponent.
// Nothing here parses HTML (no innerHTML, no inline handlers): a string is only ever text.
"use strict";

(function () {
  function meta(name) {
    const el = document.querySelector(`meta[name="${name}"]`);
    return el ? el.getAttribute("content") : "";
  }

  const base = meta("aaa-base");
  const csrf = meta("aaa-csrf");
  const enc = encodeURIComponent;

  // -- building blocks: elements with text, never markup ------------------------------------
  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function json(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function runLink(runId) {
    const a = el("a", runId);
    a.href = `${base}/runs/${enc(runId)}`;
    return a;
  }

  function time(seconds) {
    return new Date(seconds * 1000).toLocaleTimeString();
  }

  function showError(message) {
    const box = document.getElementById("error");
    if (box) box.textContent = message || "";
  }

  // Redraw a region only when its data changed, so a click is never lost to a redraw.
  const drawn = {};
  function redraw(id, data, build) {
    const key = JSON.stringify(data);
    if (drawn[id] === key) return;
    drawn[id] = key;
    const region = document.getElementById(id);
    region.replaceChildren(...build(data));
  }

  async function getJson(url) {
    const r = await fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}});
    if (!r.ok) throw new Error(`${r.status} ${r.statusText}: ${url}`);
    return r.json();
  }

  // -- approvals ----------------------------------------------------------------------------
  async function decide(p, decision, buttons) {
    buttons.forEach(b => { b.disabled = true; });
    try {
      const r = await fetch(`${base}/runs/${enc(p.run_id)}/approvals/${enc(p.call_id)}`, {
        method: "POST",
        credentials: "same-origin",
        headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
        body: JSON.stringify({decision: decision, digest: p.digest}),
      });
      if (!r.ok) {
        let message = `${r.status} ${r.statusText}`;
        try { message = (await r.json()).error || message; } catch (e) { /* not JSON */ }
        showError(`${decision}: ${message}`);
        buttons.forEach(b => { b.disabled = false; });
      } else {
        showError("");
      }
    } catch (e) {
      showError(`${decision}: ${e}`);
      buttons.forEach(b => { b.disabled = false; });
    }
  }

  function approvalBlock(p) {
    const box = el("div", null, "approval");
    box.dataset.callId = p.call_id;  // a DOM property: never parsed as markup
    box.append(el("b", p.tool), " ", el("code", json(p.arguments)), " in run ", runLink(p.run_id));
    if (p.tenant) box.append(" for tenant ", el("code", p.tenant));
    box.append(`, waiting since ${time(p.since)}`);
    if (p.expires_at) box.append(`, expires ${new Date(p.expires_at * 1000).toLocaleString()}`);
    box.append(el("br"), el("br"));
    const approve = el("button", "Approve", "approve");
    const deny = el("button", "Deny", "deny");
    approve.type = deny.type = "button";
    approve.addEventListener("click", () => decide(p, "approve", [approve, deny]));
    deny.addEventListener("click", () => decide(p, "deny", [approve, deny]));
    box.append(approve, deny);
    return box;
  }

  function approvalBlocks(list) {
    return list.length ? list.map(approvalBlock) : ["none"];
  }

  // -- the runs page --------------------------------------------------------------------------
  function runRow(x) {
    const tr = el("tr");
    const link = el("td");
    link.append(runLink(x.run_id));
    tr.append(link, el("td", x.tenant || ""), el("td", x.resumed ? `${x.status} (resumed)` : x.status));
    return tr;
  }

  async function pollIndex() {
    try {
      const a = await getJson(`${base}/approvals`);
      redraw("approvals", a.approvals, approvalBlocks);
      const r = await getJson(`${base}/runs`);
      redraw("runs", r.runs, runs => runs.map(runRow));
    } catch (e) {
      showError(String(e));
    }
  }

  // -- a run's page ---------------------------------------------------------------------------
  function attemptRow(c) {
    const tr = el("tr");
    const what = el("td");
    what.append(el("b", c.name), el("br"), el("code", c.task_id));
    const trail = el("td");
    if (!c.trail.length) trail.append("not sent");
    c.trail.forEach((e, i) => {
      if (i) trail.append(el("br"));
      trail.append(`${e.type} (attempt ${e.attempt})`);
    });
    tr.append(what, trail);
    return tr;
  }

  function eventRow(e) {
    const tr = el("tr");
    const data = el("td");
    data.append(el("code", json(e.data)));
    tr.append(el("td", String(e.seq)), el("td", e.type), data);
    return tr;
  }

  function resultBlock(result) {
    if (result.error) return [el("p", `Error: ${result.error}`)];
    const v = result.value;
    const answer = el("p", json(v && v.text !== undefined ? v.text : v));
    answer.id = "answer";
    return [answer];
  }

  async function pollRun(runId) {
    let after = 0;
    let finished = false;
    const url = `${base}/runs/${enc(runId)}`;
    while (!finished) {
      try {
        const run = await getJson(`${url}/events?after=${after}`);
        const table = document.getElementById("events");
        for (const e of run.events) {
          table.append(eventRow(e));
          after = e.seq;
        }
        document.getElementById("status").textContent =
          run.resumed ? `${run.status} (resumed ${run.resumed}x)` : run.status;
        redraw("pending", run.pending, approvalBlocks);
        if (run.result) {
          redraw("result", run.result, resultBlock);
          finished = true;
        }
        const calls = (await getJson(`${url}/attempts`)).calls;
        redraw("attempts", calls, list => list.map(attemptRow));
      } catch (e) {
        showError(String(e));
      }
      if (!finished) await new Promise(resolve => setTimeout(resolve, 500));
    }
  }

  function start() {
    const page = document.body.dataset.page;
    if (page === "index") {
      pollIndex();
      setInterval(pollIndex, 1000);
    } else if (page === "run") {
      pollRun(meta("aaa-run"));
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
