"""The kiosk: a full-screen, hands-free voice station at ``/kiosk`` (its media is the browser surface's)."""
