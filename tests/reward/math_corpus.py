"""Hand-labelled MATH-style answers for the math scorer's corpus test: (category, response, ground truth, right).

Each case is a model response (ending in, or containing, ``\\boxed{...}``), the ground truth as MATH / MATH-500
write it (LaTeX, no ``\\boxed``), and whether a grader that reads the LAST ``\\boxed{...}`` must accept it.

Right-answer categories (``right=True``) are the surface variations a correct answer comes in: ``plain``,
``units``, ``braces``, ``unordered``, ``tuple``, ``radical-pi``, ``choice``, ``symbolic``, ``labelled``,
``or-list``, ``thousands``, ``unicode-minus``, ``matrix``, ``boxed-space``, ``decimal-fraction``, ``interval``
and ``text-answer``. Near misses (``right=False``) have categories starting with ``"near-miss: "``: a wrong
value, a truncated or empty box, a rounded value, a hedged answer, no box at all, a wrong final box after a
right one, an ordered answer in the wrong order, or the wrong multiple-choice letter.

The labels are by hand, by mathematical judgement, not by what any library returns. Cases whose truth
depends on an unclear convention (a set vs. a tuple, an unsimplified form where a form is asked for) are
left out on purpose.
"""
from typing import NamedTuple


class Case(NamedTuple):
    category: str  # e.g. "units", "near-miss: wrong value"
    response: str  # a full model response ending in (or containing) \boxed{...}, as a model would write it
    ground_truth: str  # the dataset's answer as MATH / MATH-500 write it (LaTeX, no \boxed)
    right: bool  # True: a grader must accept it; False: must reject it


CASES: list[Case] = [
    # ------------------------------------------------------------------ plain
    Case("plain", r"The sum is $3+4=7$. The answer is $\boxed{7}$.", r"7", True),
    Case("plain", r"Subtracting gives $2-9=-7$, so the answer is $\boxed{-7}$.", r"-7", True),
    Case("plain", r"There are $\binom{5}{2}=10$ ways to choose the pair. The answer is $\boxed{10}$.", r"10", True),
    Case("plain", r"Three of the eight outcomes work, so the probability is $\frac{3}{8}$. The answer is $\boxed{\frac{3}{8}}$.", r"\frac{3}{8}", True),
    Case("plain", r"Solving $2x+5=0$ gives $x=-\frac{5}{2}$. The answer is $\boxed{-\frac{5}{2}}$.", r"-\frac{5}{2}", True),
    Case("plain", r"At first I get $\boxed{12}$, but I missed the corner square, so the count is $13$. The answer is $\boxed{13}$.", r"13", True),
    Case("plain", r"Since $2^{10}=1024=7\cdot 146+2$, the remainder is $2$. The answer is $\boxed{2}$.", r"2", True),
    Case("plain", r"We have $84=12\cdot 7$ and $120=12\cdot 10$ with $\gcd(7,10)=1$. The answer is $\boxed{12}$.", r"12", True),
    Case("plain", r"The integrand is odd and the interval is symmetric, so the integral is $0$. The answer is $\boxed{0}$.", r"0", True),
    Case("plain", r"My first try gave $\boxed{\frac{1}{3}}$, but I forgot the tie case. Correcting, the probability is $\boxed{\frac{5}{12}}$.", r"\frac{5}{12}", True),
    Case("plain", r"By Vieta, the product of the roots of $3x^2+x-7$ is $\frac{-7}{3}$. The answer is $\boxed{-\frac{7}{3}}$.", r"-\frac{7}{3}", True),
    # ------------------------------------------------------------------ units
    Case("units", r"The side length is $\sqrt{25}=5$ cm. The answer is $\boxed{5\text{ cm}}$.", r"5", True),
    Case("units", r"The perimeter is $3 \cdot 4 = 12$ inches. The answer is $\boxed{12 \text{ inches}}$.", r"12", True),
    Case("units", r"She spends $3 \cdot 6 = 18$ dollars. The answer is $\boxed{\$18}$.", r"18", True),
    Case("units", r"The supplement of $150^\circ$ is $30^\circ$. The answer is $\boxed{30^\circ}$.", r"30", True),
    Case("units", r"Each base angle is $\frac{180^\circ-90^\circ}{2}=45^\circ$. The answer is $\boxed{45^{\circ}}$.", r"45", True),
    Case("units", r"The increase is $\frac{12}{60}=20\%$ of the original. The answer is $\boxed{20\%}$.", r"20", True),
    Case("units", r"Three items at $\$1.50$ cost $\$4.50$. The answer is $\boxed{4.50}$.", r"\$4.50", True),
    Case("units", r"Each interior angle of a regular hexagon is $\frac{720}{6}=120$ degrees. The answer is $\boxed{120}$.", r"120^\circ", True),
    Case("units", r"The red marbles are $\frac{3}{12}$ of the total, which is $25$ percent. The answer is $\boxed{25}$.", r"25\%", True),
    Case("units", r"The area is $6 \cdot 4 = 24$ square centimetres. The answer is $\boxed{24 \text{ cm}^2}$.", r"24", True),
    Case("units", r"The car travels $60 \cdot 2.5 = 150$ miles. The answer is $\boxed{150\text{ miles}}$.", r"150", True),
    # ------------------------------------------------------------------ braces
    Case("braces", r"The derivative of $\frac{x^3}{3}$ is $x^{2}$. The answer is $\boxed{x^{2}}$.", r"x^2", True),
    Case("braces", r"One of the two equally likely outcomes works. The answer is $\boxed{\frac12}$.", r"\frac{1}{2}", True),
    Case("braces", r"The diagonal of a unit square is $\sqrt2$. The answer is $\boxed{\sqrt2}$.", r"\sqrt{2}", True),
    Case("braces", r"Three of the four outcomes work, so the answer is $\boxed{\dfrac{3}{4}}$.", r"\frac{3}{4}", True),
    Case("braces", r"The height of an equilateral triangle with side $1$ is $\frac{\sqrt3}{2}$. The answer is $\boxed{\frac{\sqrt3}{2}}$.", r"\frac{\sqrt{3}}{2}", True),
    Case("braces", r"The distance is $\sqrt{3^2+6^2}=\sqrt{45}=3\sqrt5$. The answer is $\boxed{3\sqrt5}$.", r"3\sqrt{5}", True),
    Case("braces", r"Two of the three marbles are blue. The answer is $\boxed{\tfrac{2}{3}}$.", r"\frac{2}{3}", True),
    Case("braces", r"Simplifying, $\frac{x}{x^{3}}=\frac{1}{x^{2}}$. The answer is $\boxed{\frac{1}{x^{2}}}$.", r"\frac1{x^2}", True),
    Case("braces", r"The angle is half of a right angle in radians. The answer is $\boxed{\dfrac{\pi}{4}}$.", r"\frac{\pi}{4}", True),
    # ------------------------------------------------------------------ unordered
    Case("unordered", r"Factoring, $(x-1)(x-2)=0$, so the solutions are $2$ and $1$. The answer is $\boxed{2, 1}$.", r"1, 2", True),
    Case("unordered", r"The solution set of $x^2-3x+2=0$ is $\{1,2\}$. The answer is $\boxed{\{1,2\}}$.", r"1, 2", True),
    Case("unordered", r"From $x^2=9$ we get $x=-3$ or $x=3$. The answer is $\boxed{-3, 3}$.", r"3, -3", True),
    Case("unordered", r"The roots of $(x+1)(x-2)(x-5)$ are $5$, $-1$ and $2$. The answer is $\boxed{5, -1, 2}$.", r"-1, 2, 5", True),
    Case("unordered", r"Since $2x^2+7x-4=(2x-1)(x+4)$, the roots are $\frac12$ and $-4$. The answer is $\boxed{\frac12, -4}$.", r"-4, \frac{1}{2}", True),
    Case("unordered", r"From $x^3-4x=x(x-2)(x+2)=0$ the solutions are $2, 0, -2$. The answer is $\boxed{\{2, 0, -2\}}$.", r"-2, 0, 2", True),
    Case("unordered", r"By the quadratic formula on $x^2-6x+7=0$, $x=3\pm\sqrt{2}$. The answer is $\boxed{3+\sqrt{2}, 3-\sqrt{2}}$.", r"3-\sqrt{2}, 3+\sqrt{2}", True),
    Case("unordered", r"Checking each candidate, the integers that work are $7$, $4$ and $1$. The answer is $\boxed{7, 4, 1}$.", r"1, 4, 7", True),
    # ------------------------------------------------------------------ tuple
    Case("tuple", r"Solving the system gives $x=0.5$ and $y=3$. The answer is $\boxed{(0.5, 3)}$.", r"\left(\frac12, 3\right)", True),
    Case("tuple", r"The two lines meet at $x=1$, $y=-2$. The answer is $\boxed{(1, -2)}$.", r"\left( 1, -2 \right)", True),
    Case("tuple", r"The midpoint of $(1,0)$ and $(3,3)$ is $\left(\frac{1+3}{2}, \frac{0+3}{2}\right)$. The answer is $\boxed{\left(2, \frac{3}{2}\right)}$.", r"(2, 1.5)", True),
    Case("tuple", r"The vertex is at $x=-\frac14$, $y=0$. The answer is $\boxed{(-0.25, 0)}$.", r"\left(-\frac{1}{4}, 0\right)", True),
    Case("tuple", r"The point $(0,2)$ has $r=2$ and $\theta=\frac{\pi}{2}$. The answer is $\boxed{(2,\frac{\pi}{2})}$.", r"\left( 2, \frac{\pi}{2} \right)", True),
    Case("tuple", r"The point $(0,-6,4)$ has $r=6$, $\theta=\frac{3\pi}{2}$, $z=4$. The answer is $\boxed{\left(6,\tfrac{3\pi}{2},4\right)}$.", r"\left( 6, \frac{3 \pi}{2}, 4 \right)", True),
    Case("tuple", r"Back-substituting gives $a=1$, $b=2$, $c=3$. The answer is $\boxed{(1,2,3)}$.", r"(1, 2, 3)", True),
    Case("tuple", r"We find $a=\frac{3}{4}$ and $b=-2$. The answer is $\boxed{(0.75, -2)}$.", r"\left(\frac{3}{4},-2\right)", True),
    # ------------------------------------------------------------------ radical-pi
    Case("radical-pi", r"The altitude is $\sqrt{16-4}=\sqrt{12}=2\sqrt{3}$. The answer is $\boxed{2\sqrt{3}}$.", r"\sqrt{12}", True),
    Case("radical-pi", r"The angle is a quarter turn. The answer is $\boxed{\pi/2}$.", r"\frac{\pi}{2}", True),
    Case("radical-pi", r"We have $\sin 45^\circ=\frac{1}{\sqrt{2}}$. The answer is $\boxed{\frac{1}{\sqrt{2}}}$.", r"\frac{\sqrt{2}}{2}", True),
    Case("radical-pi", r"The area is $\pi r^2 = \pi\cdot 2^2$. The answer is $\boxed{4 \pi}$.", r"4\pi", True),
    Case("radical-pi", r"The diagonal is $\sqrt{5^2+5^2}=\sqrt{50}$. The answer is $\boxed{\sqrt{50}}$.", r"5\sqrt{2}", True),
    Case("radical-pi", r"We have $\tan 30^\circ = \frac{1}{\sqrt{3}}$. The answer is $\boxed{\frac{1}{\sqrt3}}$.", r"\frac{\sqrt{3}}{3}", True),
    Case("radical-pi", r"The arc is three quarters of a semicircle of radius $1$. The answer is $\boxed{\frac34\pi}$.", r"\frac{3\pi}{4}", True),
    Case("radical-pi", r"The lateral area is $\pi r \ell = \pi\cdot 1\cdot\sqrt{2}$. The answer is $\boxed{\pi\sqrt{2}}$.", r"\sqrt{2}\pi", True),
    Case("radical-pi", r"The angle between the vectors is $120^\circ$, i.e. $2\pi/3$ radians. The answer is $\boxed{2\pi/3}$.", r"\frac{2\pi}{3}", True),
    Case("radical-pi", r"We get $\sqrt{8}+\sqrt{2}=\sqrt{18}$. The answer is $\boxed{\sqrt{18}}$.", r"3\sqrt{2}", True),
    # ------------------------------------------------------------------ choice
    Case("choice", r"Only option A satisfies both conditions. The answer is $\boxed{A}$.", r"\text{(A)}", True),
    Case("choice", r"Checking each option, only (B) works. The answer is $\boxed{(B)}$.", r"\text{(B)}", True),
    Case("choice", r"The graph matches option C. The answer is $\boxed{\textbf{(C)}}$.", r"C", True),
    Case("choice", r"Options A, B, C and E all fail for $x=2$. The answer is $\boxed{\text{(D)}}$.", r"D", True),
    Case("choice", r"The largest of the five numbers is the last one. The answer is $\boxed{E}$.", r"\textbf{(E)}", True),
    Case("choice", r"The equation has exactly one squared variable, so it is a parabola, option (C). The answer is $\boxed{(C)}$.", r"\text{(C)}", True),
    Case("choice", r"Only the first statement is always true. The answer is $\boxed{\text{A}}$.", r"\text{(A)}", True),
    # ------------------------------------------------------------------ symbolic
    Case("symbolic", r"Simplifying, the expression equals $x^2+2x+1$. The answer is $\boxed{x^2+2x+1}$.", r"(x+1)^2", True),
    Case("symbolic", r"The perimeter of an $a$ by $b$ rectangle is $2(a+b)$. The answer is $\boxed{2(a+b)}$.", r"2a+2b", True),
    Case("symbolic", r"Half of $x$ is $0.5x$. The answer is $\boxed{0.5x}$.", r"\frac{x}{2}", True),
    Case("symbolic", r"Combining like terms gives $3(x-2)$. The answer is $\boxed{3(x-2)}$.", r"3x-6", True),
    Case("symbolic", r"Collecting the factors, the monomial is $ba^2$. The answer is $\boxed{ba^2}$.", r"a^2b", True),
    Case("symbolic", r"After cancelling, what remains is $5-x$. The answer is $\boxed{5-x}$.", r"-x+5", True),
    Case("symbolic", r"Composing, $g(f(x))=x(x-1)(x+1)$. The answer is $\boxed{x(x-1)(x+1)}$.", r"x^3-x", True),
    Case("symbolic", r"Writing the quotient with a negative exponent gives $2x^{-1}$. The answer is $\boxed{2x^{-1}}$.", r"\frac{2}{x}", True),
    # ------------------------------------------------------------------ labelled
    Case("labelled", r"By the Pythagorean theorem, $AB=\sqrt{6^2+8^2}=10$. The answer is $\boxed{AB = 10}$.", r"10", True),
    Case("labelled", r"Substituting, $f(2)=2^3=8$. The answer is $\boxed{f(2) = 8}$.", r"8", True),
    Case("labelled", r"Solving $2x-3=7$ gives $x=5$. The answer is $\boxed{x = 5}$.", r"5", True),
    Case("labelled", r"For the double root we need $k=-3$. The answer is $\boxed{k=-3}$.", r"-3", True),
    Case("labelled", r"From $\frac{n(n+1)}{2}=78$ we get $n=12$. The answer is $\boxed{n = 12}$.", r"12", True),
    Case("labelled", r"Solving $2y=3$ gives $y=\frac32$. The answer is $\boxed{y=\frac32}$.", r"\frac{3}{2}", True),
    Case("labelled", r"I first wrote $\boxed{x = 4}$, but substituting back shows the solution is $x=6$. The answer is $\boxed{x=6}$.", r"6", True),
    Case("labelled", r"Adding the two equations gives $a+b=7$. The answer is $\boxed{a+b=7}$.", r"7", True),
    # ------------------------------------------------------------------ or-list
    Case("or-list", r"Factoring, $(x-1)(x+2)=0$. The answer is $\boxed{x = 1 \text{ or } x = -2}$.", r"1, -2", True),
    Case("or-list", r"Since $x^2-3x-4=(x-4)(x+1)$, the answer is $\boxed{x = 4 \text{ or } x = -1}$.", r"-1, 4", True),
    Case("or-list", r"From $x^2=9$, the answer is $\boxed{x=3 \text{ and } x=-3}$.", r"\pm 3", True),
    Case("or-list", r"From $x^2=4$, the answer is $\boxed{\pm 2}$.", r"2, -2", True),
    Case("or-list", r"From $x^2=5$, the answer is $\boxed{x=\pm\sqrt{5}}$.", r"\sqrt{5}, -\sqrt{5}", True),
    Case("or-list", r"Since $(x-1)(x-6)=0$, the values are $1$ and $6$. The answer is $\boxed{1 \text{ and } 6}$.", r"1, 6", True),
    Case("or-list", r"The roots of $x^2-4x+1=0$ are $\frac{4\pm\sqrt{12}}{2}$. The answer is $\boxed{2 \pm \sqrt{3}}$.", r"2+\sqrt{3}, 2-\sqrt{3}", True),
    Case("or-list", r"From $|x|=5$, the answer is $\boxed{x=-5 \text{ or } x=5}$.", r"\pm5", True),
    # ------------------------------------------------------------------ thousands
    Case("thousands", r"There are $10^3$ three-digit strings. The answer is $\boxed{1{,}000}$.", r"1000", True),
    Case("thousands", r"There are $10^6$ six-digit strings. The answer is $\boxed{1,000,000}$.", r"1000000", True),
    Case("thousands", r"There are $2\cdot 7! = 2\cdot 5040$ arrangements. The answer is $\boxed{10{,}080}$.", r"10080", True),
    Case("thousands", r"The square has area $50^2$. The answer is $\boxed{2{,}500}$.", r"2500", True),
    Case("thousands", r"There are $7!$ orderings of the seven books. The answer is $\boxed{5040}$.", r"5{,}040", True),
    Case("thousands", r"An hour has $60\cdot 60$ seconds. The answer is $\boxed{3600}$.", r"3,\!600", True),
    Case("thousands", r"There are $2^{20}$ subsets. The answer is $\boxed{1,\!048,\!576}$.", r"1048576", True),
    Case("thousands", r"A day has $24\cdot 3600$ seconds. The answer is $\boxed{86,400}$.", r"86400", True),
    # ------------------------------------------------------------------ unicode-minus
    Case("unicode-minus", r"Subtracting, $3-8=−5$. The answer is $\boxed{−5}$.", r"-5", True),
    Case("unicode-minus", r"The slope is $\frac{−1}{2}$. The answer is $\boxed{−\frac{1}{2}}$.", r"-\frac12", True),
    Case("unicode-minus", r"The lines meet at $x=−1$, $y=2$. The answer is $\boxed{(−1, 2)}$.", r"(-1, 2)", True),
    Case("unicode-minus", r"Multiplying out $(x−2)(x+2)$ gives the answer $\boxed{x^2 − 4}$.", r"x^2-4", True),
    Case("unicode-minus", r"The coordinate is $−\sqrt{18}$. The answer is $\boxed{−3\sqrt{2}}$.", r"-3\sqrt{2}", True),
    Case("unicode-minus", r"The inequality holds for $x \le −2$. The answer is $\boxed{(−\infty, −2]}$.", r"(-\infty,-2]", True),
    Case("unicode-minus", r"We have $4 \times (−3) = −12$. The answer is $\boxed{−12}$.", r"-12", True),
    # ------------------------------------------------------------------ matrix
    Case("matrix", r"Multiplying out, the product is $\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}}$.", r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}", True),
    Case("matrix", r"The matrix is $\boxed{\left[\begin{matrix}2&0\\-1&3\end{matrix}\right]}$.", r"\begin{pmatrix} 2 & 0 \\ -1 & 3 \end{pmatrix}", True),
    Case("matrix", r"Solving for the components gives $\boxed{\begin{pmatrix}1\\-2\end{pmatrix}}$.", r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", True),
    Case("matrix", r"The projection is $\boxed{\begin{pmatrix} \frac12 \\ 0.25 \end{pmatrix}}$.", r"\begin{pmatrix} 1/2 \\ 1/4 \end{pmatrix}", True),
    Case("matrix", r"Rotation by $90^\circ$ counterclockwise is $\boxed{\begin{bmatrix} 0 & -1 \\ 1 & 0 \end{bmatrix}}$.", r"\begin{pmatrix} 0 & -1 \\ 1 & 0 \end{pmatrix}", True),
    Case("matrix", r"The cross product is $\boxed{\begin{pmatrix}   3 \\ -1 \\   2 \end{pmatrix}}$.", r"\begin{pmatrix}3\\-1\\2\end{pmatrix}", True),
    Case("matrix", r"Rotation by $60^\circ$ clockwise is $\boxed{\begin{pmatrix} 1/2 & \sqrt{3}/2 \\ -\sqrt{3}/2 & 1/2 \end{pmatrix}}$.", r"\begin{pmatrix} \frac{1}{2} & \frac{\sqrt{3}}{2} \\ -\frac{\sqrt{3}}{2} & \frac{1}{2} \end{pmatrix}", True),
    # ------------------------------------------------------------------ boxed-space
    Case("boxed-space", r"Adding, $3+4=7$. The answer is $\boxed {7}$.", r"7", True),
    Case("boxed-space", r"Adding, $2+5=7$. The answer is $\boxed{ 7 }$.", r"7", True),
    Case("boxed-space", r"Half of the outcomes work. The answer is $\boxed{ \frac{1}{2} }$.", r"\frac{1}{2}", True),
    Case("boxed-space", r"Solving $x+5=2$ gives $x=-3$. The answer is $\boxed {-3}$.", r"-3", True),
    Case("boxed-space", r"There are $3\cdot 4$ pairs. The answer is $\boxed{  12}$.", r"12", True),
    Case("boxed-space", r"The diagonal of a unit square has length $\sqrt{2}$. The answer is $\boxed { \sqrt{2} }$.", r"\sqrt{2}", True),
    # ------------------------------------------------------------------ decimal-fraction
    Case("decimal-fraction", r"One of two equally likely outcomes works. The answer is $\boxed{0.5}$.", r"\frac{1}{2}", True),
    Case("decimal-fraction", r"Each share is $10/4$. The answer is $\boxed{2.50}$.", r"\frac{5}{2}", True),
    Case("decimal-fraction", r"One of the four suits is hearts. The answer is $\boxed{0.25}$.", r"\frac14", True),
    Case("decimal-fraction", r"Three of the four outcomes work. The answer is $\boxed{\frac{3}{4}}$.", r"0.75", True),
    Case("decimal-fraction", r"The ratio is $\frac{6}{5}$. The answer is $\boxed{1.2}$.", r"\frac{6}{5}", True),
    Case("decimal-fraction", r"We get $-\frac{1}{2^3}$. The answer is $\boxed{-0.125}$.", r"-\frac{1}{8}", True),
    Case("decimal-fraction", r"The mean of $3$ and $4$ is $\frac{7}{2}$. The answer is $\boxed{\frac{7}{2}}$.", r"3.5", True),
    Case("decimal-fraction", r"Three of the five marbles are red. The answer is $\boxed{0.6}$.", r"\frac{3}{5}", True),
    # ------------------------------------------------------------------ interval
    Case("interval", r"The inequality holds for all $x \le 3$. The answer is $\boxed{(-\infty, 3]}$.", r"(-\infty,3]", True),
    Case("interval", r"The domain is $2 \le x < 5$. The answer is $\boxed{\left[ 2, 5 \right)}$.", r"[2, 5)", True),
    Case("interval", r"We need $|x|>1$. The answer is $\boxed{(-\infty, -1) \cup (1, \infty)}$.", r"(-\infty,-1)\cup(1,\infty)", True),
    Case("interval", r"The range is $0 \le y \le \frac12$. The answer is $\boxed{[0, \frac12]}$.", r"\left[0, \frac{1}{2}\right]", True),
    Case("interval", r"The solution is $x > -2$. The answer is $\boxed{(-2, \infty)}$.", r"(-2,\infty)", True),
    Case("interval", r"The range of $\sin x$ is $\boxed{\left[-1, 1\right]}$.", r"[-1,1]", True),
    Case("interval", r"The solution is $\frac12 < x \le 4$. The answer is $\boxed{(0.5, 4]}$.", r"\left(\frac12, 4\right]", True),
    Case("interval", r"The domain of $\sqrt{x+3}$ is $x \ge -3$. The answer is $\boxed{\left[-3, \infty\right)}$.", r"[-3,\infty)", True),
    # ------------------------------------------------------------------ text-answer
    Case("text-answer", r"Since $100 = 14\cdot 7+2$, the day is two after Sunday. The answer is $\boxed{\text{Tuesday}}$.", r"Tuesday", True),
    Case("text-answer", r"A product of two odd functions satisfies $f(-x)g(-x)=f(x)g(x)$. The answer is $\boxed{\text{even}}$.", r"even", True),
    Case("text-answer", r"For $f(x)=x^3+x$ we have $f(-x)=-f(x)$. The answer is $\boxed{odd}$.", r"\text{odd}", True),
    Case("text-answer", r"For $f(x)=x^2+x$, $f(-1)=0$ while $f(1)=2$, so it is neither even nor odd. The answer is $\boxed{\text{neither}}$.", r"\text{neither}", True),
    Case("text-answer", r"January 10 is $9 = 7+2$ days after Friday, January 1. The answer is $\boxed{Sunday}$.", r"\text{Sunday}", True),
    Case("text-answer", r"Since $45 = 6\cdot 7+3$, the day is three after Monday. The answer is $\boxed{\text{Thursday}}$.", r"\text{Thursday}", True),
    Case("text-answer", r"Both $|x|$ and $\cos x$ are even, so $|x|+\cos x$ is even. The answer is $\boxed{\text{even}}$.", r"\text{even}", True),
    # ================================================================== near misses
    # ------------------------------------------------------------------ near-miss: wrong value
    Case("near-miss: wrong value", r"Counting the squares row by row gives $6$. The answer is $\boxed{6}$.", r"7", False),
    Case("near-miss: wrong value", r"Moving the $5$ across gives $x=-5$. The answer is $\boxed{-5}$.", r"5", False),
    Case("near-miss: wrong value", r"Two of the three outcomes work. The answer is $\boxed{\frac{2}{3}}$.", r"\frac{3}{4}", False),
    Case("near-miss: wrong value", r"The lines meet at $(1,-2)$. The answer is $\boxed{(1, -2)}$.", r"(1, 2)", False),
    Case("near-miss: wrong value", r"The solutions are $1$ and $2$. The answer is $\boxed{\{1, 2\}}$.", r"1, 2, 3", False),
    Case("near-miss: wrong value", r"From $x^2=9$ we get $x=3$. The answer is $\boxed{3}$.", r"3, -3", False),
    Case("near-miss: wrong value", r"The product is $\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 5 \end{pmatrix}}$.", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", False),
    Case("near-miss: wrong value", r"The domain is $2 < x < 5$. The answer is $\boxed{(2,5)}$.", r"[2,5)", False),
    Case("near-miss: wrong value", r"The altitude is $\sqrt{8}=2\sqrt{2}$. The answer is $\boxed{2\sqrt{2}}$.", r"2\sqrt{3}", False),
    Case("near-miss: wrong value", r"Expanding, I get $x^2+2x-1$. The answer is $\boxed{x^2+2x-1}$.", r"(x+1)^2", False),
    Case("near-miss: wrong value", r"The angle is $60^\circ$ in radians. The answer is $\boxed{\frac{\pi}{3}}$.", r"\frac{\pi}{6}", False),
    Case("near-miss: wrong value", r"One of the two outcomes works. The answer is $\boxed{0.5}$.", r"\frac{1}{5}", False),
    Case("near-miss: wrong value", r"The inequality holds for $x<3$. The answer is $\boxed{(-\infty, 3)}$.", r"(-\infty, 3]", False),
    Case("near-miss: wrong value", r"She spends $17$ dollars. The answer is $\boxed{\$17}$.", r"\$18", False),
    Case("near-miss: wrong value", r"The vector is $\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}$.", r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", False),
    Case("near-miss: wrong value", r"Solving $2x-3=5$ gives $x=4$. The answer is $\boxed{x = 4}$.", r"5", False),
    # ------------------------------------------------------------------ near-miss: truncated box
    Case("near-miss: truncated box", r"One of the two outcomes works, so the answer is $\boxed{\frac{1}{2}", r"\frac{1}{2}", False),
    Case("near-miss: truncated box", r"There are $3\cdot 4$ pairs. The answer is $\boxed{12", r"12", False),
    Case("near-miss: truncated box", r"The lines meet at $x=1$, $y=2$. The answer is $\boxed{(1, 2", r"(1, 2)", False),
    Case("near-miss: truncated box", r"The side is $\sqrt{3}$. The answer is $\boxed{\sqrt{3}", r"\sqrt{3}", False),
    Case("near-miss: truncated box", r"The vector is $\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", False),
    # ------------------------------------------------------------------ near-miss: empty box
    Case("near-miss: empty box", r"So $x=5$. The answer is $\boxed{}$.", r"5", False),
    Case("near-miss: empty box", r"Adding, $1+2=3$. The answer is $\boxed{ }$.", r"3", False),
    Case("near-miss: empty box", r"The probability is one half. The answer is $\boxed{}$.", r"\frac{1}{2}", False),
    Case("near-miss: empty box", r"I get $x = 7$, so the final answer is: \boxed{}", r"7", False),
    # ------------------------------------------------------------------ near-miss: rounded
    Case("near-miss: rounded", r"One of three outcomes works. The answer is $\boxed{0.333}$.", r"\frac{1}{3}", False),
    Case("near-miss: rounded", r"The area of a unit circle is $\pi \approx 3.14$. The answer is $\boxed{3.14}$.", r"\pi", False),
    Case("near-miss: rounded", r"The diagonal of a unit square is about $1.41$. The answer is $\boxed{1.41}$.", r"\sqrt{2}", False),
    Case("near-miss: rounded", r"Two of three outcomes work. The answer is $\boxed{0.67}$.", r"\frac{2}{3}", False),
    Case("near-miss: rounded", r"The length is $\sqrt{3} \approx 1.73$. The answer is $\boxed{1.73}$.", r"\sqrt{3}", False),
    Case("near-miss: rounded", r"The circumference of a unit circle is about $6.28$. The answer is $\boxed{6.28}$.", r"2\pi", False),
    Case("near-miss: rounded", r"One of six faces works. The answer is $\boxed{0.1667}$.", r"\frac16", False),
    # ------------------------------------------------------------------ near-miss: hedged
    Case("near-miss: hedged", r"It is either $18$ or $20$ depending on the overlap. The answer is $\boxed{18 \text{ or } 20}$.", r"18", False),
    Case("near-miss: hedged", r"The count is $18$ or $20$. The answer is $\boxed{18, 20}$.", r"18", False),
    Case("near-miss: hedged", r"From $x^2=9$, $x=\pm 3$. The answer is $\boxed{\pm 3}$.", r"3", False),
    Case("near-miss: hedged", r"I am not sure whether the endpoint counts. The answer is $\boxed{4 \text{ or } 5}$.", r"5", False),
    Case("near-miss: hedged", r"Depending on replacement, the probability is $\frac12$ or $\frac13$. The answer is $\boxed{\frac{1}{2}, \frac{1}{3}}$.", r"\frac{1}{2}", False),
    # ------------------------------------------------------------------ near-miss: no box
    Case("near-miss: no box", r"Multiplying $6$ by $7$, the answer is 42.", r"42", False),
    Case("near-miss: no box", r"Solving $2x-3=7$, therefore $x = 5$.", r"5", False),
    Case("near-miss: no box", r"One of two outcomes works, so the probability is $\frac{1}{2}$.", r"\frac{1}{2}", False),
    Case("near-miss: no box", "There are $3\\cdot 4$ pairs.\n\n**Final Answer:** 12", r"12", False),
    Case("near-miss: no box", r"The lines meet where $x=1$, so the answer is $(1, -2)$.", r"(1, -2)", False),
    # ------------------------------------------------------------------ near-miss: last box wrong
    Case("near-miss: last box wrong", r"I get $\boxed{7}$. Hmm, let me recount the corner: the answer is $\boxed{8}$.", r"7", False),
    Case("near-miss: last box wrong", r"The point is $\boxed{(1, 3)}$. Wait, swapping the roles of the lines, it is $\boxed{(1, -3)}$.", r"(1, 3)", False),
    Case("near-miss: last box wrong", r"The probability is $\boxed{\frac{1}{2}}$, or rather, after dividing by two again, $\boxed{\frac{1}{4}}$.", r"\frac{1}{2}", False),
    Case("near-miss: last box wrong", r"Option A fits, so $\boxed{A}$. On second thought, option B fits better: $\boxed{B}$.", r"\text{(A)}", False),
    Case("near-miss: last box wrong", r"Solving $x+5=2$ gives $\boxed{-3}$; double-checking the sign, I write $\boxed{3}$.", r"-3", False),
    # ------------------------------------------------------------------ near-miss: order matters
    Case("near-miss: order matters", r"The solution is $x=1$, $y=3$. The answer is $\boxed{(3, 1)}$.", r"(1, 3)", False),
    Case("near-miss: order matters", r"We find $a=-1$ and $b=4$. The answer is $\boxed{(4, -1)}$.", r"(-1, 4)", False),
    Case("near-miss: order matters", r"The solution is $2 < x < 5$. The answer is $\boxed{(5, 2)}$.", r"(2, 5)", False),
    Case("near-miss: order matters", r"The point has $r=2$ and $\theta=\frac{\pi}{2}$. The answer is $\boxed{\left(\frac{\pi}{2}, 2\right)}$.", r"\left( 2, \frac{\pi}{2} \right)", False),
    Case("near-miss: order matters", r"The vector is $\boxed{\begin{pmatrix} 2 \\ 1 \end{pmatrix}}$.", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", False),
    Case("near-miss: order matters", r"Back-substituting, the answer is $\boxed{(2, 1, 3)}$.", r"(1, 2, 3)", False),
    # ------------------------------------------------------------------ near-miss: wrong choice
    Case("near-miss: wrong choice", r"Only option B satisfies both conditions. The answer is $\boxed{B}$.", r"\text{(A)}", False),
    Case("near-miss: wrong choice", r"The graph matches option C. The answer is $\boxed{\text{(C)}}$.", r"\text{(D)}", False),
    Case("near-miss: wrong choice", r"The largest value is (E). The answer is $\boxed{(E)}$.", r"\text{(B)}", False),
    Case("near-miss: wrong choice", r"Only the first statement holds. The answer is $\boxed{\textbf{(A)}}$.", r"C", False),
    Case("near-miss: wrong choice", r"Options A, B, C and E fail. The answer is $\boxed{D}$.", r"\text{(E)}", False),
]
