// Live updates: the broker says "change" (or "tick") on /dashboard/events;
// the page then reloads its own main content (?fragment=1) and swaps it in,
// keeping the keyboard focus where it was. Nothing else runs on the page.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var status = document.getElementById("live");
  if (!main || !window.EventSource) { return; }
  var busy = false, again = false;

  function focusKey(el) {
    if (!el || !main.contains(el)) { return null; }
    return el.id ? "#" + el.id : (el.getAttribute("href") ? 'a[href="' + el.getAttribute("href") + '"]' : null);
  }

  function reload() {
    if (busy) { again = true; return; }
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (resp) {
      if (!resp.ok) { throw new Error(resp.status); }
      return resp.text();
    }).then(function (html) {
      var key = focusKey(document.activeElement);
      main.innerHTML = html;
      if (key) {
        var el = main.querySelector(key);
        if (el) { el.focus(); }
      }
      document.body.dataset.updated = String(Date.now());
    }).catch(function () { /* keep what is shown; the next event retries */ }).then(function () {
      busy = false;
      if (again) { again = false; reload(); }
    });
  }

  var cell = document.body.dataset.cell;
  var es = new EventSource("/dashboard/events" + (cell ? "?cell=" + encodeURIComponent(cell) : ""));
  es.addEventListener("open", function () { status.textContent = "live"; status.classList.add("on"); });
  es.addEventListener("error", function () { status.textContent = "reconnecting"; status.classList.remove("on"); });
  function update() {
    // Do not redraw under a form the operator is filling in.
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "SELECT")) { return; }
    reload();
  }
  es.addEventListener("change", update);
  es.addEventListener("tick", update);
})();
