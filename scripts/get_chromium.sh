#!/bin/sh
# The browser the page's tests drive (tests/test_webui_browser.py): Debian's chromium, through
# Playwright's executable_path (Playwright's own browser download is not reachable everywhere).
# Installed with apt where it is missing and this shell may (root); otherwise one line says so, and
# those tests skip with the same reason. Never fails the test command.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
        exit 0
    fi
fi
echo "get_chromium: no chromium here and none installed (apt-get install chromium): the browser tests skip" >&2
exit 0
