"""The embedded hub runs the GPU idle culler by default: NVML when a driver is present;
without one the culler is off and the admin page says why."""

from __future__ import annotations

from hub_config.config.idle_service import SERVICE
from tests.support.hub import RunningHub


def test_the_admin_page_of_a_hub_without_a_driver_says_the_culler_is_off_and_why(tmp_path):
    hub = RunningHub(tmp_path, None).start()  # this machine has no NVIDIA driver
    try:
        admin = hub.login("admin")
        page = admin.get(hub.url + "/hub/gpulab/admin", timeout=30)
        assert page.status_code == 200, page.text[:500]
        assert 'data-culler-status="off"' in page.text
        assert "no NVIDIA driver found" in page.text
        services = hub.api("GET", "/services").json()
        assert SERVICE not in services
    finally:
        hub.close()
