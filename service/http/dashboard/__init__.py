"""The dashboard: server-rendered pages of what each namespace learned (``/dashboard``).

A sub-application mounted under the API app: its pages are not API routes (no OpenAPI entry,
HTML answers), and it authenticates on its own, with the API's keys (``service.auth``): the key
is given once to a login form and kept in an HttpOnly, SameSite=Strict cookie; a request
without one is treated exactly as an API request without a key (on loopback, with key
enforcement off, it is the anonymous admin). Every page shows only the namespaces the key may
use. Templates, CSS, the small sorting script and the charts ship in the package: no request
leaves the origin (the Content-Security-Policy says so to the browser too).
"""

from service.http.dashboard.app import DASHBOARD_PATH, mount_dashboard

__all__ = ["DASHBOARD_PATH", "mount_dashboard"]
