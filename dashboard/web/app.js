// The runs page: rows from /api/events (a snapshot each time something
// changed), a run's log from /api/log (the relay's event stream, passed
// through). Filters and the open run live in the URL's hash, so a link
// shows the same view. Plain DOM, no framework: the page is embedded in
// the clipjob binary and loads nothing else.
"use strict";

const $ = (id) => document.getElementById(id);
const LINE_HEIGHT = 18; // px, as .log .line in style.css
const STATE_NAMES = { queued: "queued", running: "running", succeeded: "succeeded", failed: "failed", refused: "refused at start", timed_out: "timed out" };

let snapshot = { runs: [], notices: [], relay: false };

// ---- the URL's hash: company, agent, state, run --------------------------

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  return { company: p.get("company") || "", agent: p.get("agent") || "", state: p.get("state") || "", run: p.get("run") || "" };
}

function writeHash(change) {
  const h = Object.assign(readHash(), change);
  const p = new URLSearchParams();
  for (const k of ["company", "agent", "state", "run"]) if (h[k]) p.set(k, h[k]);
  const s = p.toString();
  if (("#" + s) !== location.hash) location.hash = s;
}

// ---- formatting: times in the viewer's zone -------------------------------

const timeFormat = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
const clockFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3 });

// A time the relay sent that is not one shows as nothing, not an error
// that stops the page drawing.
function validDate(s) { const d = new Date(s); return s && !isNaN(d) ? d : null; }
function fmtTime(s) { const d = validDate(s); return d ? timeFormat.format(d) : ""; }

function fmtDuration(run) {
  if (!run.started) return "";
  const end = run.finished ? new Date(run.finished) : new Date();
  let secs = Math.max(0, Math.round((end - new Date(run.started)) / 1000));
  const h = Math.floor(secs / 3600), m = Math.floor((secs % 3600) / 60);
  secs %= 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + secs + "s";
}

function fmtCost(c) { return c == null ? "" : "$" + c.toFixed(c < 1 ? 4 : 2); }

function fmtTokens(u) {
  if (!u) return "";
  const input = (u.inputTokens || 0) + (u.cacheReadInputTokens || 0) + (u.cacheCreationInputTokens || 0);
  return input.toLocaleString() + " / " + (u.outputTokens || 0).toLocaleString();
}

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "dataset") Object.assign(e.dataset, v);
    else if (k in e) e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function runLink(key, text) {
  const p = new URLSearchParams(location.hash.slice(1));
  p.set("run", key);
  return el("a", { href: "#" + p.toString(), className: "run-link" }, text);
}

// What a run's Details cell says: where it waits, why it ended so.
function details(run) {
  if (run.state === "queued") {
    const span = el("span", { className: "position" }, run.position ? "#" + run.position + " in queue" : "in queue");
    if (run.waitsFor) {
      span.append(", behind ");
      span.append(run.waitsFor.key ? runLink(run.waitsFor.key, run.waitsFor.run) : run.waitsFor.job);
    }
    return span;
  }
  if (run.reason) return el("span", { className: "reason" }, run.reason);
  if (run.summary) return el("span", { className: "summary" }, run.summary);
  return "";
}

// ---- the runs table ---------------------------------------------------------

function filtered() {
  const h = readHash();
  return snapshot.runs.filter((r) => (!h.company || r.company === h.company) && (!h.agent || r.agent === h.agent) && (!h.state || r.state === h.state));
}

function fillSelect(sel, values, current) {
  const have = Array.from(sel.options).slice(1).map((o) => o.value).join("\n");
  const want = Array.from(new Set(values.concat(current ? [current] : []))).filter(Boolean).sort();
  if (have !== want.join("\n")) {
    sel.replaceChildren(el("option", { value: "" }, "all"), ...want.map((v) => el("option", { value: v }, v)));
  }
  sel.value = current;
}

function render() {
  const h = readHash();
  fillSelect($("f-company"), snapshot.runs.map((r) => r.company), h.company);
  fillSelect($("f-agent"), snapshot.runs.filter((r) => !h.company || r.company === h.company).map((r) => r.agent), h.agent);
  $("f-state").value = h.state;
  $("notices").replaceChildren(...(snapshot.notices || []).map((n) => el("li", {}, n)));

  const rows = filtered();
  const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : null;
  const body = $("runs").tBodies[0];
  body.replaceChildren(...rows.map((r) => {
    const tr = el("tr", { tabIndex: 0, dataset: { key: r.key, state: r.state } },
      el("td", { className: "state " + r.state, "data-label": "State" }, STATE_NAMES[r.state] || r.state),
      el("td", { "data-label": "Run" }, runLink(r.key, r.id), r.jobGone ? el("span", { className: "gone", title: "its Job was deleted; the relay keeps the run" }, " (Job gone)") : null,
        r.holdsClaim ? el("span", { className: "gone", title: "holds its agent's claim" }, " ⚑") : null),
      el("td", { "data-label": "Agent" }, r.agent),
      el("td", { "data-label": "Company" }, r.company || ""),
      el("td", { "data-label": "Started" }, fmtTime(r.started)),
      el("td", { className: "num", "data-label": "Duration" }, fmtDuration(r)),
      el("td", { className: "num", "data-label": "Cost" }, fmtCost(r.costUsd)),
      el("td", { className: "num", "data-label": "Tokens" }, fmtTokens(r.usage)),
      el("td", { "data-label": "Details" }, details(r)));
    if (r.key === h.run) tr.classList.add("selected");
    return tr;
  }));
  if (focused) { const again = body.querySelector(`tr[data-key="${CSS.escape(focused)}"]`); if (again) again.focus(); }
  $("empty").hidden = rows.length > 0;
  $("count").textContent = "(" + rows.length + (rows.length !== snapshot.runs.length ? " of " + snapshot.runs.length : "") + ")";
  renderDetail();
  scheduleCosts();
}

// ---- one run: its facts and its log -----------------------------------------

let open = null; // { key, abort, lines, matches, query, ended, following }

function renderDetail() {
  const h = readHash();
  const run = snapshot.runs.find((r) => r.key === h.run);
  $("detail").hidden = !h.run;
  if (!h.run) { closeLog(); return; }
  $("d-id").textContent = run ? run.id : h.run;
  const facts = [];
  const add = (k, v) => { if (v !== "" && v != null) facts.push(el("dt", {}, k), el("dd", {}, v)); };
  if (!run) {
    add("State", "not among the runs you may see (yet)");
  } else {
    add("State", STATE_NAMES[run.state] || run.state);
    add("Waits", run.state === "queued" ? details(run) : "");
    add("Reason", run.state !== "queued" ? run.reason : "");
    add("Namespace", run.namespace);
    add("Job", run.job ? run.job + (run.jobGone ? " (deleted; kept by the relay)" : "") : "");
    add("Agent", run.agent);
    add("Company", run.company);
    add("Adapter", run.adapter);
    add("Task", run.task);
    add("Created", fmtTime(run.created));
    add("Started", fmtTime(run.started));
    add("Finished", fmtTime(run.finished));
    add("Duration", fmtDuration(run));
    add("Outcome", run.outcome ? run.outcome + (run.exitCode != null ? " (exit " + run.exitCode + ")" : "") : "");
    add("Cost", fmtCost(run.costUsd));
    add("Tokens in/out", fmtTokens(run.usage));
    add("Model", run.model);
    add("Session", run.session);
    add("Result", run.summary);
    add("Errors", run.errors ? run.errors.join("\n") : "");
  }
  $("d-facts").replaceChildren(...facts);
  if (!open || open.key !== h.run) openLog(h.run, run);
  else if (!open.following && run && run.logged && !open.ended) openLog(h.run, run); // its log began
}

function closeLog() {
  if (open) open.abort.abort();
  open = null;
}

function openLog(key, run) {
  closeLog();
  open = { key, abort: new AbortController(), lines: [], matches: null, query: $("search").value.toLowerCase(), ended: false, following: false };
  if (open.query) open.matches = [];
  drawLog(true);
  // A run with no log yet (queued, refused) shows why instead of an
  // empty box.
  $("logview").hidden = !(run && run.logged);
  if (!run || !run.logged) {
    $("log-state").textContent = !snapshot.relay ? "No relay configured: start clipjob dashboard with --relay-url and --relay-token-file to read logs." :
      run && (run.state === "queued" || run.state === "refused") ? "No log: the run has not started." : "No log yet.";
    return;
  }
  open.following = true;
  follow(open, run);
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// follow reads the run's log as NDJSON until its end event, resuming
// after the last line it has when the stream breaks. The lines of each
// chunk are taken a slice at a time, yielding between slices, so a long
// log arriving at once never holds the page for long.
async function follow(mine, run) {
  const q = new URLSearchParams({ namespace: run.namespace, run: run.id });
  if (run.jobUid) q.set("job", run.jobUid);
  const SLICE = 1000;
  while (open === mine) {
    const after = mine.lines.length ? mine.lines[mine.lines.length - 1].seq : 0;
    try {
      const resp = await fetch("api/log?" + q.toString() + "&after=" + after, { signal: mine.abort.signal, headers: { Accept: "application/x-ndjson" } });
      if (!resp.ok) {
        $("log-state").textContent = "Cannot read the log: " + (await resp.text()).trim();
        if (resp.status === 404) return;
        await sleep(2000);
        continue;
      }
      $("log-state").textContent = "Following…";
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let rest = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const parts = (rest + decoder.decode(value, { stream: true })).split("\n");
        rest = parts.pop();
        for (let i = 0; i < parts.length; i++) {
          if (open !== mine) return;
          if (i > 0 && i % SLICE === 0) { scheduleDraw(); await sleep(0); }
          if (!parts[i]) continue;
          let ev;
          try { ev = JSON.parse(parts[i]); } catch {
            // One record the relay sent malformed is skipped, said once;
            // the rest of the log goes on.
            if (!mine.skipped) $("log-state").textContent = "A line of this log could not be read and is left out.";
            mine.skipped = true;
            continue;
          }
          if (ev.type === "line") {
            mine.lines.push(ev);
            if (mine.matches && matches(ev, mine.query)) mine.matches.push(mine.lines.length - 1);
          } else if (ev.type === "end") {
            mine.ended = true;
            scheduleDraw();
            $("log-state").textContent = "Ended: " + ev.phase + (ev.exitCode != null ? ", exit " + ev.exitCode : "") + " — " + mine.lines.length.toLocaleString() + " lines.";
            mine.abort.abort();
            return;
          }
        }
        scheduleDraw();
      }
    } catch (e) {
      if (mine.abort.signal.aborted) return;
    }
    if (open === mine) { $("log-state").textContent = "Reconnecting…"; await sleep(1000); }
  }
}

function matches(l, q) { return l.line.toLowerCase().includes(q); }

function setQuery(q) {
  if (!open) return;
  open.query = q.toLowerCase();
  if (!open.query) { open.matches = null; }
  else {
    const m = [];
    for (let i = 0; i < open.lines.length; i++) if (matches(open.lines[i], open.query)) m.push(i);
    open.matches = m;
  }
  drawLog(true);
}

let drawPending = false;
function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; drawLog(false); });
}

// drawLog renders only the lines in view (a 100k-line log keeps a few
// dozen elements), over a spacer as tall as the whole log.
function drawLog(reset) {
  const box = $("log");
  if (!open) { $("log-window").replaceChildren(); return; }
  const view = open.matches || null;
  const total = view ? view.length : open.lines.length;
  $("log-spacer").style.height = total * LINE_HEIGHT + "px";
  $("matches").textContent = open.query ? total.toLocaleString() + " matching of " + open.lines.length.toLocaleString() : "";
  if ($("follow").checked || reset) box.scrollTop = $("follow").checked ? box.scrollHeight : 0;
  const first = Math.max(0, Math.floor(box.scrollTop / LINE_HEIGHT) - 10);
  const last = Math.min(total, first + Math.ceil(box.clientHeight / LINE_HEIGHT) + 20);
  const win = $("log-window");
  win.style.top = first * LINE_HEIGHT + "px";
  const items = [];
  for (let i = first; i < last; i++) {
    const l = open.lines[view ? view[i] : i];
    items.push(lineElement(l, open.query));
  }
  win.replaceChildren(...items);
}

function lineElement(l, q) {
  const d = el("div", { className: "line", dataset: { seq: l.seq } },
    el("span", { className: "seq" }, String(l.seq)),
    el("span", { className: "ts", title: fmtTime(l.ts) }, validDate(l.ts) ? clockFormat.format(validDate(l.ts)) : ""));
  const text = el("span", { className: "text" });
  d.append(text);
  if (!q) { text.append(l.line); return d; }
  const lower = l.line.toLowerCase();
  let at = 0;
  for (let i = lower.indexOf(q); i >= 0; i = lower.indexOf(q, at)) {
    text.append(l.line.slice(at, i), el("mark", {}, l.line.slice(i, i + q.length)));
    at = i + q.length;
  }
  text.append(l.line.slice(at));
  d.title = l.line;
  return d;
}

// ---- costs over a period ------------------------------------------------------

let costsTimer = null;
function scheduleCosts() {
  if (costsTimer) return;
  costsTimer = setTimeout(() => { costsTimer = null; loadCosts(); }, 300);
}

async function loadCosts() {
  const q = new URLSearchParams();
  // Days in the viewer's zone: midnight local, sent as an instant.
  if ($("p-from").value) q.set("from", new Date($("p-from").value + "T00:00:00").toISOString().replace(/\.\d+Z$/, "Z"));
  if ($("p-until").value) {
    const u = new Date($("p-until").value + "T00:00:00");
    u.setDate(u.getDate() + 1);
    q.set("until", u.toISOString().replace(/\.\d+Z$/, "Z"));
  }
  const h = readHash();
  try {
    const resp = await fetch("api/costs?" + q.toString());
    const data = await resp.json();
    const totals = (data.totals || []).filter((t) => (!h.company || t.company === h.company) && (!h.agent || !t.agent || t.agent === h.agent));
    $("costs").tBodies[0].replaceChildren(...totals.map((t) => el("tr", { className: t.agent ? "agent" : "company" },
      el("td", { "data-label": "Company" }, t.agent ? "" : (t.company || "(none)")),
      el("td", { "data-label": "Agent" }, t.agent || "all agents"),
      el("td", { className: "num", "data-label": "Runs" }, String(t.runs)),
      el("td", { className: "num", "data-label": "Cost", title: t.priced < t.runs ? (t.runs - t.priced) + " of its runs have no cost (yet)" : "" },
        t.priced ? fmtCost(t.costUsd) + (t.priced < t.runs ? " *" : "") : ""),
      el("td", { className: "num", "data-label": "Tokens" }, fmtTokens({ inputTokens: t.inputTokens, outputTokens: t.outputTokens })))));
  } catch (e) { /* the next snapshot tries again */ }
}

// ---- wiring -----------------------------------------------------------------------

function connect() {
  const events = new EventSource("api/events");
  events.addEventListener("runs", (e) => {
    snapshot = JSON.parse(e.data);
    $("live").textContent = "live";
    $("live").classList.add("on");
    render();
  });
  events.onerror = () => { $("live").textContent = "reconnecting…"; $("live").classList.remove("on"); };
}

// Running runs' durations tick between snapshots, touching only those
// cells: a full render would rebuild every row each second.
function tickDurations() {
  const byKey = new Map(snapshot.runs.map((r) => [r.key, r]));
  for (const tr of $("runs").tBodies[0].querySelectorAll('tr[data-state="running"]')) {
    const run = byKey.get(tr.dataset.key);
    if (run) tr.cells[5].textContent = fmtDuration(run);
  }
}

function moveFocus(step) {
  const rows = Array.from($("runs").tBodies[0].rows);
  if (!rows.length) return;
  const at = rows.indexOf(document.activeElement);
  rows[Math.min(rows.length - 1, Math.max(0, at < 0 ? 0 : at + step))].focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("zone").textContent = Intl.DateTimeFormat().resolvedOptions().timeZone;
  for (const name of ["company", "agent", "state"]) {
    $("f-" + name).addEventListener("change", (e) => writeHash({ [name]: e.target.value }));
  }
  $("d-close").addEventListener("click", (e) => { e.preventDefault(); writeHash({ run: "" }); });
  $("search").addEventListener("input", (e) => setQuery(e.target.value));
  $("follow").addEventListener("change", () => drawLog(false));
  $("log").addEventListener("scroll", () => {
    const box = $("log");
    // Scrolling up stops following; back at the bottom resumes it.
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - LINE_HEIGHT;
    if ($("follow").checked !== atBottom && document.activeElement !== $("follow")) $("follow").checked = atBottom;
    scheduleDraw();
  });
  $("p-from").addEventListener("change", loadCosts);
  $("p-until").addEventListener("change", loadCosts);
  $("runs").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.target.dataset.key) writeHash({ run: e.target.dataset.key });
  });
  document.addEventListener("keydown", (e) => {
    const typing = e.target.matches("input, select, textarea");
    if (e.key === "Escape") { if (typing) e.target.blur(); else writeHash({ run: "" }); return; }
    if (typing) return;
    if (e.key === "j") moveFocus(1);
    else if (e.key === "k") moveFocus(-1);
    else if (e.key === "/" && !$("detail").hidden) e.preventDefault();
  });
  // "/" moves to the search on its keyup, once its character was dealt
  // with, so the "/" is never typed into the search.
  document.addEventListener("keyup", (e) => {
    if (e.key === "/" && !$("detail").hidden && !e.target.matches("input, select, textarea")) $("search").focus();
  });
  window.addEventListener("hashchange", render);
  setInterval(tickDurations, 1000);
  connect();
});
