"""The HTML pages of the web integrations: plain HTML with a little polling JavaScript.

``{{base}}`` is where the routes live (``/aaa``), ``{{run_id}}`` the run shown.
"""

from __future__ import annotations

_STYLE = """
<style>
 body { font-family: system-ui, sans-serif; margin: 2rem; max-width: 60rem; color: #222; }
 code, pre { background: #f4f4f4; padding: 0 .3em; }
 table { border-collapse: collapse; width: 100%; margin: .5rem 0 1.5rem; }
 td, th { border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left; vertical-align: top; }
 .approval { border: 2px solid #e8a200; padding: .7rem; margin: .5rem 0; border-radius: 6px; }
 button { padding: .3rem .9rem; margin-right: .4rem; }
 .status { font-weight: bold; }
</style>
<script>
 function csrf() { const m = document.cookie.match(/csrftoken=([^;]+)/); return m ? m[1] : ""; }
 async function decide(runId, callId, decision, digest) {
   const r = await fetch(`{{base}}/runs/${runId}/approvals/${callId}`, {method: "POST",
     headers: {"Content-Type": "application/json", "X-CSRFToken": csrf()},
     body: JSON.stringify({decision: decision, digest: digest})});
   if (!r.ok) alert(await r.text());
 }
 // Rebuild a live region only when its content changed, so a click is never lost to a redraw.
 function setHtml(id, html) {
   const el = document.getElementById(id);
   if (el.dataset.html !== html) { el.innerHTML = html; el.dataset.html = html; }
 }
 function esc(v) { const d = document.createElement("div"); d.textContent = typeof v === "string" ? v : JSON.stringify(v); return d.innerHTML; }
 function approvalHtml(p) {
   return `<div class="approval" id="approval-${esc(p.call_id)}"><b>${esc(p.tool)}</b>
     <code>${esc(p.arguments)}</code> in run <a href="{{base}}/runs/${esc(p.run_id)}">${esc(p.run_id)}</a>,
     waiting since ${new Date(p.since * 1000).toLocaleTimeString()}<br><br>
     <button class="approve" onclick="decide('${esc(p.run_id)}','${esc(p.call_id)}','approve','${esc(p.digest)}')">Approve</button>
     <button class="deny" onclick="decide('${esc(p.run_id)}','${esc(p.call_id)}','deny','${esc(p.digest)}')">Deny</button></div>`;
 }
</script>
"""

INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>Agent runs</title>""" + _STYLE + """</head>
<body>
<h1>Agent runs</h1>
<form method="post" action="{{base}}/runs">
  <input type="hidden" name="csrfmiddlewaretoken" value="{{csrf}}">
  <input name="task" size="50" placeholder="refund order A-100" required>
  <input name="tenant" size="12" placeholder="tenant (optional)">
  <button type="submit">Start a run</button>
</form>
<h2>Waiting for a person</h2><div id="approvals">none</div>
<h2>Runs</h2><table id="runs"></table>
<script>
 async function poll() {
   const a = await (await fetch("{{base}}/approvals")).json();
   setHtml("approvals", a.approvals.length ? a.approvals.map(approvalHtml).join("") : "none");
   const r = await (await fetch("{{base}}/runs")).json();
   setHtml("runs", r.runs.map(x =>
     `<tr><td><a href="{{base}}/runs/${esc(x.run_id)}">${esc(x.run_id)}</a></td><td>${esc(x.tenant || "")}</td><td>${esc(x.status)}</td></tr>`).join(""));
 }
 poll(); setInterval(poll, 1000);
</script>
</body></html>
"""

RUN = """<!doctype html>
<html><head><meta charset="utf-8"><title>Run {{run_id}}</title>""" + _STYLE + """</head>
<body>
<p><a href="{{base}}/">all runs</a></p>
<h1>Run <code>{{run_id}}</code>: <span class="status" id="status">…</span></h1>
<div id="result"></div>
<h2>Waiting for a person</h2><div id="pending">none</div>
<h2>Events</h2><table id="events"><tr><th>#</th><th>event</th><th>data</th></tr></table>
<h2>Calls and their attempts</h2><table id="attempts"></table>
<script>
 const runId = "{{run_id}}";
 let after = 0, finished = false;
 async function attempts() {
   const calls = (await (await fetch(`{{base}}/runs/${runId}/attempts`)).json()).calls;
   setHtml("attempts", calls.map(c =>
     `<tr><td><b>${esc(c.name)}</b><br><code>${esc(c.task_id)}</code></td><td>${c.trail.map(e =>
       `${esc(e.type)} (attempt ${e.attempt})`).join("<br>") || "not sent"}</td></tr>`).join(""));
 }
 async function poll() {
   const run = await (await fetch(`{{base}}/runs/${runId}/events?after=${after}`)).json();
   const table = document.getElementById("events");
   for (const e of run.events) {
     table.insertAdjacentHTML("beforeend", `<tr><td>${e.seq}</td><td>${esc(e.type)}</td><td><code>${esc(e.data)}</code></td></tr>`);
     after = e.seq;
   }
   document.getElementById("status").textContent = run.status;
   setHtml("pending", run.pending.length ? run.pending.map(approvalHtml).join("") : "none");
   if (run.result) {
     document.getElementById("result").innerHTML = run.result.error ? `<p>Error: ${esc(run.result.error)}</p>`
       : `<p id="answer">${esc(run.result.value && run.result.value.text !== undefined ? run.result.value.text : run.result.value)}</p>`;
     finished = true;
   }
   await attempts();
   if (!finished) setTimeout(poll, 500);
 }
 poll();
</script>
</body></html>
"""
