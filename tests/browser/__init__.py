"""Real hubs and labs driven by Chromium (markers ``integration``, ``browser``)."""
