"""The broker (``run-api``): the durable queue between environments and the trainer.

- :func:`atroposlib.api.app.create_app` builds the HTTP app from
  :class:`atroposlib.api.settings.BrokerSettings`;
- :class:`atroposlib.api.broker.Broker` is the state machine behind it (no HTTP);
- :class:`atroposlib.client.TrainerClient` and :class:`~atroposlib.client.EnvClient`
  are the clients trainers and environments use.

Nothing is imported here, so clients do not pull in the server's dependencies.
"""
