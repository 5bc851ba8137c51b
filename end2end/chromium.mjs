// How every browser test and benchmark starts Debian's Chromium: never a downloaded browser, and none of the
// background networking this machine's closed network refuses.
export const CHROMIUM = "/usr/bin/chromium";
export const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
