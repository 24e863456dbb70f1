"""Fedge's Python API: configure and run a session, run an agent, register your own model, data set or loss, and
load a trained model back into your own ``nn.Module``. docs/api.md documents it; its examples run as a test.

    from fedge import api
    api.register_model("sensor-cnn", my_package.models.sensor_cnn)
    config = api.session_config(run={"rounds": 3}, model={"name": "sensor-cnn"}, data={"dataset": "my_pkg:windows"})
    report = api.run_session(config, run_dir="runs/first")
    net = api.load_model("runs/first", my_package.models.sensor_cnn((3, 64), 6, {}))

The command-line interfaces (``coordinator``, ``edge-agent``) are thin layers over the same functions. This
package is the top of the layer picture: it may import every other Fedge package, and none imports it.
"""

from fedge.api.session import (
    check_session,
    load_model,
    register_dataset,
    register_loss,
    register_model,
    run_agent,
    run_session,
    session_config,
)
from fedge.coordinator.config import Config, ConfigError
from fedge.plugins import PluginError

__all__ = ["Config", "ConfigError", "PluginError", "check_session", "load_model", "register_dataset",
           "register_loss", "register_model", "run_agent", "run_session", "session_config"]
