import os, sys, cloudpickle
from monarch.actor import Actor, endpoint
#cloudpickle.register_pickle_by_value(sys.modules[__name__])
class C(Actor):
    @endpoint
    def pid(self): return os.getpid()
def test_x(procs2):
    m = procs2.spawn("c", C)
    print(m.pid.call().get(timeout=10))
    pass
