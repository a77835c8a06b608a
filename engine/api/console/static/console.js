// chronoq console: live sections, the create form's preview, confirmations. No build step, no framework.
// Everything from the server is either server-escaped HTML (live sections) or set with textContent.
"use strict";
(function () {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  // Sections marked data-live="NAME" are re-fetched with ?fragment=NAME every few seconds.
  function refresh(section) {
    if (document.hidden) return;
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", section.dataset.live);
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then((r) => (r.ok ? r.text() : null))
      .then((text) => { if (text !== null) { section.innerHTML = text; section.dataset.refreshed = String(Date.now()); } })
      .catch(() => {});
  }
  document.querySelectorAll("[data-live]").forEach((section) => {
    window.setInterval(() => refresh(section), 3000);
  });

  // The create form's live preview of the next fires, DST days marked.
  const form = document.getElementById("create-form");
  if (form) {
    const list = document.getElementById("preview-list");
    const error = document.getElementById("preview-error");
    let timer = null;
    const update = () => {
      const body = {
        kind: form.elements.kind.value,
        expression: form.elements.expression.value,
        time_zone: form.elements.time_zone.value,
      };
      if (!body.expression.trim()) { list.replaceChildren(); error.textContent = ""; return; }
      fetch(form.dataset.preview, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
        body: JSON.stringify(body),
      }).then((r) => r.json()).then((data) => {
        list.replaceChildren();
        error.textContent = "";
        if (data.error) { error.textContent = data.error.message; return; }
        for (const fire of data.fires) {
          const item = document.createElement("li");
          item.textContent = fire.utc + "  ";
          const local = document.createElement("small");
          local.textContent = fire.local;
          item.appendChild(local);
          if (fire.dst) {
            const mark = document.createElement("span");
            mark.className = "dst";
            mark.textContent = " " + fire.dst;
            item.appendChild(mark);
          }
          list.appendChild(item);
        }
        list.dataset.updated = String(Date.now());
      }).catch(() => { error.textContent = "preview unavailable"; });
    };
    form.addEventListener("input", () => { window.clearTimeout(timer); timer = window.setTimeout(update, 250); });
    update();
  }

  document.querySelectorAll("form[data-confirm]").forEach((f) => {
    f.addEventListener("submit", (event) => { if (!window.confirm(f.dataset.confirm)) event.preventDefault(); });
  });
})();
