"""Fedge's simulations: fleets of clients in one process, driven by the runtime's own protocol objects.

``simulation.inprocess`` plays a whole session without sockets, processes or threads: the coordinator's and every
agent's protocol objects exchange real packets, agents keep a real two-phase device state, and the algorithms' two
halves run exactly as they do in the coordinator and on the devices. Must not import zmq, sockets or threads.
"""
