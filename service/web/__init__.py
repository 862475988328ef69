"""The dashboard: server-rendered pages at `/`, beside the JSON API at /api/v1.

Pages read through the same use cases as the API (service/usecases/); tables and forms work without
JavaScript, which only draws the Plotly charts, shows times in the viewer's time zone and follows a
running run's progress. Plotly's JavaScript is served from the installed package: no CDN.
"""

from service.web.routes import router
from service.web.sign_in import error_page, sign_in_router

__all__ = ["error_page", "router", "sign_in_router"]
