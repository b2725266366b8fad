"""Kernel Gateway's channel connection with TCP_NODELAY on the WebSocket.

Stock Kernel Gateway (and Enterprise Gateway) never disable Nagle on the kernel WebSocket:
every small reply then waits for the client's delayed ACK (~40 ms per request). Pass
``--KernelGatewayApp.kernel_websocket_connection_class=kg_nodelay.NoDelayConnection``.
"""

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection


class NoDelayConnection(ZMQChannelsWebsocketConnection):
    def connect(self):
        self.websocket_handler.set_nodelay(True)
        return super().connect()
