// Switchyard fleet page: polls /v1/fleet and /metrics on the same origin and
// renders the capacity table as the dispatcher sees it. No dependencies, so
// it works offline and behind any proxy that forwards the broker's routes.
(() => {
  'use strict';

  const params = new URLSearchParams(location.search);
  // ?poll=250 polls faster (milliseconds, at least 100); the default is 1 s.
  const POLL_MS = Math.max(100, parseInt(params.get('poll') || '1000', 10) || 1000);
  const HISTORY = 120; // chart samples kept
  const KEY = 'switchyard.apiKey';
  const ROUTES = ['regular', 'pd'];

  let apiKey = '';
  try { apiKey = sessionStorage.getItem(KEY) || ''; } catch (_) { /* storage disabled */ }
  let running = false;
  let prevCounters = null; // {t, req, sum, count} from the last /metrics
  const samples = [];      // {rps:{regular,pd}, ttft:{regular,pd}|null, dcount, dsum}

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s ?? '').replace(/[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  const num = (x) => (typeof x === 'number' && isFinite(x) ? x : 0);
  const fmtSlots = (x) => (Number.isInteger(x) ? String(x) : x.toFixed(1));
  const fmtRate = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
  const fmtMs = (s) => { const ms = s * 1000; return ms >= 100 ? ms.toFixed(0) : ms.toFixed(1); };

  function fmtAge(sec) {
    if (!isFinite(sec)) return '–';
    if (sec < 0) sec = 0;
    if (sec < 10) return sec.toFixed(1) + ' s';
    if (sec < 120) return sec.toFixed(0) + ' s';
    if (sec < 7200) return (sec / 60).toFixed(0) + ' min';
    return (sec / 3600).toFixed(1) + ' h';
  }

  async function get(url, accept) {
    const headers = { Accept: accept };
    if (apiKey) headers.Authorization = 'Bearer ' + apiKey;
    return fetch(url, { headers, cache: 'no-store', credentials: 'same-origin' });
  }

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.conn = state;
    $('conn-text').textContent = text;
  }

  // ---- polling -------------------------------------------------------------

  async function tick() {
    let view;
    try {
      const r = await get('/v1/fleet', 'application/json');
      if (r.status === 401) {
        showAuth(apiKey ? 'The broker refused this key.' : '');
        setConn('auth', 'API key required');
        return false;
      }
      if (!r.ok) throw new Error('HTTP ' + r.status);
      view = await r.json();
    } catch (e) {
      setConn('error', 'broker unreachable, retrying (' + (e && e.message ? e.message : e) + ')');
      $('app').classList.add('stale-data');
      return true;
    }
    hideAuth();
    $('app').classList.remove('stale-data');
    setConn('live', 'live · every ' + (POLL_MS / 1000) + ' s');
    let counters = null;
    try {
      const r = await get('/metrics', 'text/plain');
      if (r.ok) counters = parseMetrics(await r.text());
    } catch (_) { /* metrics are optional */ }
    record(view, counters);
    render(view);
    return true;
  }

  async function loop() {
    if (running) return;
    running = true;
    for (;;) {
      const start = performance.now();
      const again = await tick();
      if (!again) break;
      await new Promise((res) => setTimeout(res, Math.max(0, POLL_MS - (performance.now() - start))));
    }
    running = false;
  }

  // ---- API key -------------------------------------------------------------

  function showAuth(msg) {
    const f = $('auth');
    f.hidden = false;
    $('auth-error').textContent = msg || '';
    $('api-key').focus();
  }
  function hideAuth() { $('auth').hidden = true; }

  $('auth').addEventListener('submit', (ev) => {
    ev.preventDefault();
    apiKey = $('api-key').value.trim();
    try { sessionStorage.setItem(KEY, apiKey); } catch (_) { /* storage disabled */ }
    $('auth-error').textContent = '';
    loop();
  });

  // ---- metrics -------------------------------------------------------------

  // parseMetrics sums the Prometheus counters the page charts, by route.
  function parseMetrics(text) {
    const zero = () => ({ regular: 0, pd: 0 });
    const out = { req: zero(), sum: zero(), count: zero() };
    const re = /^(switchyard_requests_total|switchyard_time_to_first_token_seconds_sum|switchyard_time_to_first_token_seconds_count)(\{[^}]*\})?\s+(\S+)/;
    for (const line of text.split('\n')) {
      if (line === '' || line[0] === '#') continue;
      const m = re.exec(line);
      if (!m) continue;
      const v = parseFloat(m[3]);
      if (!isFinite(v)) continue;
      const rm = /route="([^"]*)"/.exec(m[2] || '');
      const route = rm && rm[1] === 'pd' ? 'pd' : 'regular';
      const field = m[1].endsWith('_sum') ? 'sum' : m[1].endsWith('_count') ? 'count' : 'req';
      out[field][route] += v;
    }
    return out;
  }

  // recentRate is requests per second from the fleet view's recent split,
  // a count over a sliding window: the fallback when /metrics is not
  // reachable (for example behind a proxy that forwards /v1 only).
  function recentRate(view) {
    let seen = false;
    const n = { regular: 0, pd: 0 };
    for (const m of view.models || []) {
      const r = m.recent;
      if (!r || !(num(r.window_seconds) > 0)) continue;
      seen = true;
      n.regular += num(r.regular) / r.window_seconds;
      n.pd += num(r.pd) / r.window_seconds;
    }
    return seen ? n : null;
  }

  function record(view, c) {
    const t = performance.now() / 1000;
    const s = { rps: null, ttft: null, dsum: 0, dcount: 0 };
    if (c) {
      if (prevCounters) {
        const dt = t - prevCounters.t;
        const d = (f, r) => Math.max(0, c[f][r] - prevCounters[f][r]); // a restart resets counters
        if (dt > 0) {
          s.rps = { regular: d('req', 'regular') / dt, pd: d('req', 'pd') / dt };
          s.ttft = {};
          for (const r of ROUTES) {
            const dc = d('count', r);
            s.ttft[r] = dc > 0 ? d('sum', r) / dc : null;
            s.dcount += dc;
            s.dsum += d('sum', r);
          }
        }
      }
      prevCounters = { t, ...c };
    }
    if (!s.rps) s.rps = recentRate(view);
    if (!s.rps && !s.ttft && samples.length === 0) return;
    samples.push(s);
    if (samples.length > HISTORY) samples.shift();
  }

  // ---- charts --------------------------------------------------------------

  function niceMax(v, floor) {
    v = Math.max(v, floor);
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function drawChart(svg, series, floor, fmt) {
    const w = Math.max(200, Math.round(svg.clientWidth || 600));
    const h = Math.max(80, Math.round(svg.clientHeight || 150));
    svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    const L = 42, R = 8, T = 8, B = 18;
    const pw = w - L - R, ph = h - T - B;
    let max = 0, any = false;
    for (const s of series) for (const v of s.values) if (v != null) { any = true; max = Math.max(max, v); }
    const top = niceMax(max, floor);
    const x = (i) => L + pw * (i / (HISTORY - 1));
    const y = (v) => T + ph * (1 - v / top);
    let out = '';
    for (const f of [0, 0.5, 1]) {
      const yy = (T + ph * (1 - f)).toFixed(1);
      out += `<line class="grid" x1="${L}" x2="${w - R}" y1="${yy}" y2="${yy}"/>`;
      out += `<text class="axis" x="${L - 6}" y="${(+yy + 4).toFixed(1)}" text-anchor="end">${esc(fmt(top * f))}</text>`;
    }
    out += `<text class="axis" x="${L}" y="${h - 4}">${esc(Math.round(HISTORY * POLL_MS / 1000))} s ago</text>`;
    out += `<text class="axis" x="${w - R}" y="${h - 4}" text-anchor="end">now</text>`;
    if (!any) {
      out += `<text class="nodata" x="${L + pw / 2}" y="${T + ph / 2}" text-anchor="middle">no requests yet</text>`;
    }
    const off = HISTORY - series[0].values.length;
    for (const s of series) {
      let d = '', area = '', run = [];
      let dots = '';
      const flush = () => {
        if (run.length === 0) return;
        if (run.length === 1) { // a lone sample has no line to draw
          dots += `<circle class="dot ${s.cls}" cx="${x(run[0][0]).toFixed(1)}" cy="${y(run[0][1]).toFixed(1)}" r="2.5"/>`;
        }
        d += 'M' + run.map(([i, v]) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join('L');
        area += `M${x(run[0][0]).toFixed(1)},${y(0)}L` +
          run.map(([i, v]) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join('L') +
          `L${x(run[run.length - 1][0]).toFixed(1)},${y(0)}Z`;
        run = [];
      };
      s.values.forEach((v, i) => { if (v == null) flush(); else run.push([i + off, v]); });
      flush();
      if (d === '') continue;
      if (s.area) out += `<path class="area ${s.cls}" d="${area}"/>`;
      out += `<path class="line ${s.cls}" d="${d}"/>` + dots;
    }
    svg.innerHTML = out;
  }

  function renderCharts() {
    const pick = (f, r) => samples.map((s) => (s[f] ? s[f][r] : null));
    const axis = (v) => String(+v.toFixed(2));
    // A route that has carried nothing in the window is left out rather
    // than drawn along the baseline, except the regular one as a reference.
    const used = (vals, r) => r === 'regular' || vals.some((v) => v > 0);
    const rps = ROUTES.map((r) => ({ cls: r, values: pick('rps', r), area: true })).filter((s, i) => used(s.values, ROUTES[i]));
    const ttft = ROUTES.map((r) => ({ cls: r, values: pick('ttft', r).map((v) => (v == null ? null : v * 1000)) }));
    drawChart($('chart-rps'), rps, 1, axis);
    drawChart($('chart-ttft'), ttft, 10, axis);

    const last = samples.slice(-5).filter((s) => s.rps);
    const rpsEl = $('sum-rps');
    if (last.length) {
      const rps = last.reduce((a, s) => a + s.rps.regular + s.rps.pd, 0) / last.length;
      rpsEl.textContent = fmtRate(rps);
      rpsEl.dataset.rps = rps.toFixed(3);
    }
    // TTFT mean over the last ten samples that saw a first token.
    let ds = 0, dc = 0;
    for (const s of samples.slice(-10)) { ds += s.dsum; dc += s.dcount; }
    const tEl = $('sum-ttft');
    if (dc > 0) {
      tEl.innerHTML = esc(fmtMs(ds / dc)) + ' <small>ms</small>';
      tEl.dataset.ttft = (ds / dc).toFixed(6);
    } else if (!tEl.dataset.ttft) {
      tEl.textContent = '–';
    }
  }

  // ---- fleet ---------------------------------------------------------------

  function splitBar(kind, a, b, fmt) {
    const total = a + b;
    if (!(total > 0)) {
      return `<div class="splitbar" data-split="${kind}"><div class="none">no eligible route</div></div>`;
    }
    const pa = (100 * a) / total, pb = 100 - pa;
    const seg = (cls, v, p) => (v > 0
      ? `<div class="${cls}" style="flex-grow:${p.toFixed(3)}" title="${cls} ${esc(fmt(v))}">${cls === 'pd' ? 'PD' : 'regular'} ${p.toFixed(0)}% · ${esc(fmt(v))}</div>`
      : '');
    return `<div class="splitbar" data-split="${kind}" data-regular="${a}" data-pd="${b}">${seg('regular', a, pa)}${seg('pd', b, pb)}</div>`;
  }

  // Prefix-cache affinity per pool: the share of requests offered to the
  // agent caching their prefix, fallbacks by reason, the engines' hit rate.
  function affinityHTML(aff) {
    const pools = Object.keys(aff || {}).sort();
    if (pools.length === 0) return '';
    return '<div class="affinity">' + pools.map((p) => {
      const a = aff[p];
      const fb = Object.keys(a.fallbacks || {}).sort()
        .map((r) => `<span class="fb" data-fallback="${esc(r)}">${esc(r.replace(/_/g, ' '))} <b>${num(a.fallbacks[r])}</b></span>`).join('');
      const hit = a.engine_hit_rate === undefined || a.engine_hit_rate === null ? '–' : (100 * num(a.engine_hit_rate)).toFixed(0) + '%';
      return `<div class="aff" data-affinity-pool="${esc(p)}" data-share="${num(a.share)}">` +
        `<span class="pool-tag ${esc(p)}">${esc(p)}</span> <span class="lbl" title="prefix-cache affinity mode">affinity ${esc(a.mode)}</span>` +
        `<span title="requests offered to the agent caching their prefix">by affinity <b>${(100 * num(a.share)).toFixed(0)}%</b> of ${num(a.dispatched)}</span>` +
        `<span class="fbs" title="fallbacks to the shared queue">${fb}</span>` +
        `<span title="prompt tokens found in the engines' prefix caches">engine hit rate <b>${hit}</b></span></div>`;
    }).join('') + '</div>';
  }

  function modelHTML(m) {
    const wr = num(m.weights && m.weights.regular), wp = num(m.weights && m.weights.pd);
    let queue = '';
    if (m.queue) {
      queue = '<div class="queue" title="jobs waiting in the JetStream work queue">queued' +
        ['regular', 'prefill', 'decode'].map((p) => {
          const n = num(m.queue[p]);
          return `<span class="q${n > 0 ? ' busy' : ''}" data-queue-pool="${p}" data-depth="${n}">${p} <b>${n}</b></span>`;
        }).join('') + '</div>';
    }
    let split = `<span class="lbl">Route weights</span>${splitBar('weights', wr, wp, (v) => fmtSlots(v))}`;
    if (m.recent) {
      const win = num(m.recent.window_seconds);
      split += `<span class="lbl" title="requests started in the last ${win} s">Recent${win > 0 ? ' ' + win + ' s' : ''}</span>${splitBar('recent', num(m.recent.regular), num(m.recent.pd), (v) => String(v))}`;
    }
    // The batch column shows once the broker reports batch work per pool.
    const batchCol = (m.pools || []).some((p) => poolBatch(p));
    const rows = (m.pools || []).map((p) => {
      // active: every agent's jobs, draining ones included; utilisation
      // is of the eligible agents, as dispatch counts them.
      const eff = num(p.effective_slots), act = num(p.active), eact = num(p.eligible_active);
      const util = eff > 0 ? Math.min(1, eact / eff) : 0;
      const dim = p.agents === 0 ? ' class="muted"' : '';
      // Requests with latency targets that met them, and what the broker
      // learned of the pool's latency (absent until it has).
      let slo = '<td class="num muted">–</td>';
      if (p.slo && num(p.slo.met) + num(p.slo.missed) > 0) {
        const met = num(p.slo.met), all = met + num(p.slo.missed);
        const pct = Math.round(100 * met / all);
        let tip = `${met} of ${all} requests with targets met them`;
        if (p.learned) {
          tip += `; learned TTFT ${(num(p.learned.ttft_seconds) * 1000).toFixed(0)} ms, inter-token ${(num(p.learned.itl_seconds) * 1000).toFixed(1)} ms`;
        }
        slo = `<td class="num${pct < 90 ? ' hot' : ''}" data-slo="${pct}" title="${esc(tip)}">${pct}%</td>`;
      }
      return `<tr data-pool="${esc(p.pool)}"${dim}>` +
        `<td><span class="pool-tag ${esc(p.pool)}">${esc(p.pool)}</span></td>` +
        `<td class="num">${p.agents}</td><td class="num">${p.eligible}</td>` +
        `<td class="num">${p.slots}</td><td class="num">${fmtSlots(eff)}</td>` +
        `<td class="num" data-active="${act}" title="${eact} on eligible agents">${act}</td><td class="num">${fmtSlots(num(p.free))}</td>` +
        `<td><span class="bar"><span class="track"><span class="fill util${util > 0.85 ? ' hot' : ''}" style="width:${(util * 100).toFixed(1)}%"></span></span>` +
        `<span class="txt">${(util * 100).toFixed(0)}%</span></span></td>${slo}${batchCol ? poolBatchCell(p) : ''}</tr>`;
    }).join('');
    return `<div class="model-head"><span class="model-name">${esc(m.model)}</span>` +
      `<span class="mode" title="dispatch weight mode">${esc(m.mode)}</span>${queue}</div>` +
      `<div class="split">${split}</div>` + affinityHTML(m.affinity) +
      `<table class="pools"><thead><tr><th>Pool</th><th class="num">Agents</th><th class="num">Eligible</th>` +
      `<th class="num">Slots</th><th class="num">Effective</th><th class="num" title="jobs held by all the pool's agents, draining ones included">Active</th><th class="num">Free</th><th title="eligible agents' active over effective slots">Utilisation</th><th class="num" title="requests with latency targets (x-slo-ttft-ms, x-slo-itl-ms, --slo-ttft, --slo-itl) that met them">Targets met</th>` +
      (batchCol ? '<th title="the share of the pool\'s slots batch work holds, and the slots">Batch</th>' : '') + '</tr></thead>' +
      `<tbody>${rows}</tbody></table>`;
  }

  // poolBatch is a pool's batch work as /v1/fleet reports it: the batch
  // jobs its agents run, those waiting in its batch queue, and the share
  // of its slots they hold; null from a broker without work classes.
  function poolBatch(p) {
    const b = p.batch;
    if (!b || typeof b !== 'object') return null;
    return { running: num(b.running), queued: num(b.queued), share: Math.max(0, Math.min(1, num(b.slot_share))) };
  }

  function poolBatchCell(p) {
    const b = poolBatch(p);
    if (!b) return '<td class="num muted">–</td>';
    const pct = (100 * b.share).toFixed(0);
    return `<td data-batch-share="${b.share.toFixed(3)}" data-batch-running="${b.running}" title="${b.running} slots on batch work, ${b.queued} batch lines queued">` +
      `<span class="bar"><span class="track"><span class="fill batch" style="width:${(100 * b.share).toFixed(1)}%"></span></span>` +
      `<span class="txt">${pct}% · ${b.running}</span></span></td>`;
  }

  const BATCH_STATUSES = ['validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled'];

  // batchHTML is a batch in flight: its lines queued (not yet run),
  // running, completed and failed, and the share of them done.
  function batchHTML(b) {
    const l = b.lines || {};
    const total = num(l.total), done = num(l.completed), failed = num(l.failed);
    const frac = total > 0 ? Math.min(1, (done + failed) / total) : 0;
    const status = BATCH_STATUSES.includes(b.status) ? b.status : 'unknown';
    return {
      status,
      html: `<td class="mono">${esc(b.id)}</td>` +
        `<td><span class="badge batch-${status}">${esc(b.status)}</span></td>` +
        `<td class="mono muted">${esc(b.endpoint || '')}</td>` +
        `<td class="num">${total}</td><td class="num">${num(l.queued)}</td><td class="num">${num(l.running)}</td>` +
        `<td class="num">${done}</td><td class="num${failed > 0 ? ' hot' : ''}">${failed}</td>` +
        `<td><span class="bar" data-progress="${frac.toFixed(3)}"><span class="track"><span class="fill batch" style="width:${(frac * 100).toFixed(1)}%"></span></span>` +
        `<span class="txt">${(frac * 100).toFixed(0)}%</span></span></td>` +
        `<td class="mono muted" title="the broker driving the batch">${esc(b.driver || '–')}</td>`,
    };
  }

  // renderBatches shows the batches in flight, absent when the broker has
  // no Batches API.
  function renderBatches(view) {
    const f = view.batches;
    $('batches-wrap').hidden = !f;
    if (!f) return;
    const items = f.items || [];
    keyed($('batches-body'), items, 'tr', (b) => 'b:' + b.id, (el, b) => {
      const r = batchHTML(b);
      const l = b.lines || {};
      el.dataset.batchId = b.id;
      el.dataset.status = r.status;
      el.dataset.lines = `${num(l.queued)}/${num(l.running)}/${num(l.completed)}/${num(l.failed)}/${num(l.total)}`;
      setHTML(el, r.html);
    });
    if (items.length === 0) $('batches-body').innerHTML = '<tr><td colspan="10" class="empty">No batch in flight.</td></tr>';
    const l = f.lines || {};
    const c = $('batches-count');
    c.textContent = `${num(f.active)} in flight · ${num(l.queued)} lines queued, ${num(l.running)} running`;
    c.dataset.active = String(num(f.active));
  }

  function agentHTML(a, at) {
    const stale = a.reason === 'stale';
    const status = stale ? 'stale' : (['ready', 'warming', 'draining'].includes(a.state) ? a.state : 'unknown');
    const slots = num(a.slots), eff = num(a.effective_slots);
    const frac = slots > 0 ? Math.min(1, eff / slots) : 0;
    const ramp = a.eligible && frac < 0.999;
    const fillCls = !a.eligible || eff === 0 ? 'zero' : ramp ? 'ramping' : '';
    const hbAge = (at - Date.parse(a.last_heartbeat)) / 1000;
    const engine = [a.engine, a.transport].filter(Boolean).join(' · ');
    const badgeTitle = stale ? `last reported ${a.state}` : (a.ready_since ? `ready since ${a.ready_since}` : '');
    const note = a.reason && a.reason !== status ? a.reason : (ramp ? 'slow start' : '');
    return {
      status,
      html: `<td class="mono">${esc(a.id)}</td><td class="mono muted">${esc(a.model)}</td>` +
        `<td><span class="pool-tag ${esc(a.pool)}">${esc(a.pool)}</span></td>` +
        `<td><span class="badge ${status}" title="${esc(badgeTitle)}">${esc(stale ? 'stale · ' + a.state : a.state)}</span></td>` +
        `<td class="num">${slots}</td><td class="num">${num(a.active)}</td>` +
        `<td><span class="bar" data-effective="${eff}"><span class="track"><span class="fill ${fillCls}" style="width:${(frac * 100).toFixed(1)}%"></span></span>` +
        `<span class="txt">${fmtSlots(eff)} / ${slots}</span></span></td>` +
        `<td class="muted">${esc(engine || '–')}</td>` +
        `<td class="num hb${stale ? ' late' : ''}">${fmtAge(hbAge)}</td>` +
        `<td class="muted">${esc(note)}</td>`,
    };
  }

  // keyed reconciles children of parent with items, reusing elements by key
  // so rows keep their identity (and tests their handles) across polls.
  function keyed(parent, items, tag, key, fill) {
    const old = new Map();
    for (const el of Array.from(parent.children)) if (el.dataset.key) old.set(el.dataset.key, el);
    let prev = null;
    for (const it of items) {
      const k = key(it);
      let el = old.get(k);
      if (el) old.delete(k); else { el = document.createElement(tag); el.dataset.key = k; }
      fill(el, it);
      const want = prev ? prev.nextSibling : parent.firstChild;
      if (el !== want) parent.insertBefore(el, want);
      prev = el;
    }
    for (const el of old.values()) el.remove();
    for (const el of Array.from(parent.children)) if (!el.dataset.key) el.remove();
  }

  function setHTML(el, html) {
    if (el._html !== html) { el.innerHTML = html; el._html = html; }
  }

  function render(view) {
    const at = Date.parse(view.at) || Date.now();
    const models = view.models || [];
    const agents = (view.agents || []).slice();
    // An agent whose engine has not named its model yet is in no model.
    for (const p of view.pending || []) {
      agents.push({ id: p.id, model: '', pool: p.pool, state: 'warming', slots: p.slots, active: 0, effective_slots: 0,
        engine: p.engine, last_heartbeat: p.last_heartbeat, reason: 'model pending: ' + (p.state_reason || '') });
    }

    keyed($('models'), models, 'div', (m) => 'm:' + m.model, (el, m) => {
      el.className = 'model';
      el.dataset.model = m.model;
      setHTML(el, modelHTML(m));
    });
    if (models.length === 0) $('models').innerHTML = '<p class="empty">No agent has sent a heartbeat yet.</p>';

    keyed($('agents-body'), agents, 'tr', (a) => a.model + '\u0000' + a.id, (el, a) => {
      const r = agentHTML(a, at);
      el.dataset.agentId = a.id;
      el.dataset.model = a.model;
      el.dataset.pool = a.pool;
      el.dataset.state = a.state;
      el.dataset.status = r.status;
      el.dataset.eligible = String(!!a.eligible);
      setHTML(el, r.html);
    });
    renderBatches(view);
    if (agents.length === 0) $('agents-body').innerHTML = '<tr><td colspan="10" class="empty">No agents.</td></tr>';

    let eligible = 0, slots = 0, eff = 0, active = 0;
    for (const m of models) for (const p of m.pools || []) {
      eligible += num(p.eligible); slots += num(p.slots); eff += num(p.effective_slots); active += num(p.active);
    }
    $('sum-agents').innerHTML = `${eligible} <small>/ ${agents.length}</small>`;
    $('sum-slots').innerHTML = `${esc(fmtSlots(eff))} <small>/ ${slots}</small>`;
    $('sum-active').textContent = String(active);
    $('agents-count').textContent = String(agents.length);
    $('at').textContent = 'broker time ' + new Date(at).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
    document.body.dataset.updated = view.at || '';
    renderCharts();
  }

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(renderCharts, 100);
  });

  renderCharts();
  loop();
})();
