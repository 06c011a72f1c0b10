"""Azure Service Bus, all of it in one place: the transport (``transport``, with its field
``mapping``, the SDK's edge ``sdk`` and the error classification ``errors``), the command queue
(``command_queue``, built up from ``sending``, ``held`` and ``receiving``, with the ``commands``
mapping and the ``dead_letters`` subqueue), the clients from the environment (``connection``) and
``outbox migrate``'s provisioning (``admin``). Each module imports the optional SDK only through
``sdk``, so importing this package loads nothing of it."""
